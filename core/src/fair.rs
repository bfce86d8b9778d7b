//! Fair order of queued candidates: organizations with less active CPU first, interleaved
//! round-robin; inside one organization, higher priority first, then older first.
//!
//! `FairQueue` is the placement leader's live structure (O(log n) per push and pick, charges
//! applied as sandboxes activate); `fair_order` is the same rule over a static snapshot.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::{OrgId, SandboxId};

/// A queued sandbox as the fair order sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub id: SandboxId,
    pub org: OrgId,
    pub priority: i32,
    /// CPU the sandbox will reserve once active (charged to its org on activation).
    pub cpu: u64,
}

/// Orders `candidates` fairly, given each organization's active CPU, without charging
/// anything: orgs sorted by active CPU, then taken one candidate each in turn.
/// Sandbox ids are monotonic ULIDs, so a smaller id is an older sandbox.
pub fn fair_order(candidates: Vec<Candidate>, active_cpu: &HashMap<OrgId, u64>) -> Vec<Candidate> {
    let mut per_org: BTreeMap<OrgId, Vec<Candidate>> = BTreeMap::new();
    for c in candidates {
        per_org.entry(c.org.clone()).or_default().push(c);
    }
    let mut orgs: Vec<(u64, OrgId, std::vec::IntoIter<Candidate>)> = per_org
        .into_iter()
        .map(|(org, mut list)| {
            list.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.id.cmp(&b.id)));
            let cpu = active_cpu.get(&org).copied().unwrap_or(0);
            (cpu, org, list.into_iter())
        })
        .collect();
    orgs.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for (_, _, it) in orgs.iter_mut() {
            if let Some(c) = it.next() {
                out.push(c);
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

type Item = (Reverse<i32>, SandboxId);

#[derive(Default)]
struct OrgQueue {
    active_cpu: u64,
    /// When this org was last served; lower goes first among equal CPU (round-robin).
    served: u64,
    items: BTreeSet<Item>,
    cpu_of: HashMap<SandboxId, u64>,
}

/// The live fair queue. Pick order: the non-empty organization with the least active CPU,
/// ties to the one served longest ago; inside it, highest priority, then oldest.
#[derive(Default)]
pub struct FairQueue {
    orgs: HashMap<OrgId, OrgQueue>,
    /// (active cpu, last served, org) of every non-empty org.
    order: BTreeSet<(u64, u64, OrgId)>,
    where_is: HashMap<SandboxId, (OrgId, i32)>,
    clock: u64,
}

impl FairQueue {
    /// An empty queue.
    pub fn new() -> FairQueue {
        FairQueue::default()
    }

    /// Queued candidates.
    pub fn len(&self) -> usize {
        self.where_is.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.where_is.is_empty()
    }

    /// Queued candidates per org (for the queue-depth gauge; one cheap pass over the orgs).
    pub fn depth_by_org(&self) -> impl Iterator<Item = (&OrgId, usize)> + '_ {
        self.orgs
            .iter()
            .map(|(org, q)| (org, q.items.len()))
            .filter(|(_, n)| *n > 0)
    }

    /// Whether `id` is queued.
    pub fn contains(&self, id: &SandboxId) -> bool {
        self.where_is.contains_key(id)
    }

    fn unlink(&mut self, org: &OrgId) {
        if let Some(q) = self.orgs.get(org) {
            self.order.remove(&(q.active_cpu, q.served, org.clone()));
        }
    }

    fn relink(&mut self, org: &OrgId) {
        if let Some(q) = self.orgs.get(org) {
            if !q.items.is_empty() {
                self.order.insert((q.active_cpu, q.served, org.clone()));
            }
        }
    }

    /// Adds a candidate; a second push of the same id is ignored.
    pub fn push(&mut self, c: Candidate) {
        if self.where_is.contains_key(&c.id) {
            return;
        }
        self.unlink(&c.org);
        let q = self.orgs.entry(c.org.clone()).or_default();
        q.items.insert((Reverse(c.priority), c.id.clone()));
        q.cpu_of.insert(c.id.clone(), c.cpu);
        self.where_is.insert(c.id, (c.org.clone(), c.priority));
        self.relink(&c.org);
    }

    /// Removes a candidate (deleted, or placed elsewhere); false if it was not queued.
    pub fn remove(&mut self, id: &SandboxId) -> bool {
        let Some((org, priority)) = self.where_is.remove(id) else {
            return false;
        };
        self.unlink(&org);
        if let Some(q) = self.orgs.get_mut(&org) {
            q.items.remove(&(Reverse(priority), id.clone()));
            q.cpu_of.remove(id);
        }
        self.relink(&org);
        self.gc(&org);
        true
    }

    fn gc(&mut self, org: &OrgId) {
        let empty = self
            .orgs
            .get(org)
            .is_some_and(|q| q.items.is_empty() && q.active_cpu == 0);
        if empty {
            self.orgs.remove(org);
        }
    }

    /// Takes the next candidate in fair order.
    pub fn pop(&mut self) -> Option<Candidate> {
        let (_, _, org) = self.order.iter().next().cloned()?;
        self.unlink(&org);
        self.clock += 1;
        let clock = self.clock;
        let q = self.orgs.get_mut(&org)?;
        let (Reverse(priority), id) = q.items.pop_first()?;
        let cpu = q.cpu_of.remove(&id).unwrap_or(0);
        q.served = clock;
        self.where_is.remove(&id);
        self.relink(&org);
        Some(Candidate {
            id,
            org,
            priority,
            cpu,
        })
    }

    /// Sets an organization's active CPU (from the store, the truth).
    pub fn set_active_cpu(&mut self, org: &OrgId, cpu: u64) {
        self.unlink(org);
        self.orgs.entry(org.clone()).or_default().active_cpu = cpu;
        self.relink(org);
        self.gc(org);
    }

    /// Replaces every organization's active CPU with `cpu` (absent orgs: 0), e.g. after
    /// reading the truth from the store.
    pub fn reset_active_cpu(&mut self, cpu: &HashMap<OrgId, u64>) {
        let known: Vec<OrgId> = self.orgs.keys().chain(cpu.keys()).cloned().collect();
        for org in known {
            self.set_active_cpu(&org, cpu.get(&org).copied().unwrap_or(0));
        }
    }

    /// Adds `cpu` to an organization's active CPU (a sandbox of it just activated).
    pub fn charge(&mut self, org: &OrgId, cpu: u64) {
        let now = self.orgs.get(org).map_or(0, |q| q.active_cpu);
        self.set_active_cpu(org, now.saturating_add(cpu));
    }

    /// Takes back a `charge` made for an activation that did not happen (the placer charges
    /// when it picks, so picks made while earlier ones are still in flight see them).
    pub fn refund(&mut self, org: &OrgId, cpu: u64) {
        let now = self.orgs.get(org).map_or(0, |q| q.active_cpu);
        self.set_active_cpu(org, now.saturating_sub(cpu));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(id: &SandboxId, org: &OrgId, priority: i32) -> Candidate {
        Candidate {
            id: id.clone(),
            org: org.clone(),
            priority,
            cpu: 1,
        }
    }

    #[test]
    fn idle_org_first_then_round_robin_then_priority_and_age() {
        let (a, b) = (OrgId::new(), OrgId::new());
        let ids: Vec<SandboxId> = (0..4).map(|_| SandboxId::new()).collect();
        let list = vec![
            cand(&ids[0], &a, 0),
            cand(&ids[1], &a, 5),
            cand(&ids[2], &a, 0),
            cand(&ids[3], &b, 0),
        ];
        let cpu = HashMap::from([(a.clone(), 8), (b.clone(), 0)]);
        let order: Vec<_> = fair_order(list, &cpu).into_iter().map(|c| c.id).collect();
        assert_eq!(
            order,
            vec![
                ids[3].clone(),
                ids[1].clone(),
                ids[0].clone(),
                ids[2].clone()
            ]
        );
    }

    #[test]
    fn queue_serves_the_least_loaded_org_and_charges_move_it_back() {
        let (a, b) = (OrgId::new(), OrgId::new());
        let mut q = FairQueue::new();
        q.set_active_cpu(&a, 8);
        let a_ids: Vec<SandboxId> = (0..3).map(|_| SandboxId::new()).collect();
        let b_ids: Vec<SandboxId> = (0..3).map(|_| SandboxId::new()).collect();
        for id in &a_ids {
            q.push(Candidate {
                id: id.clone(),
                org: a.clone(),
                priority: 0,
                cpu: 4,
            });
        }
        for id in &b_ids {
            q.push(Candidate {
                id: id.clone(),
                org: b.clone(),
                priority: 0,
                cpu: 4,
            });
        }
        let first = q.pop().unwrap();
        assert_eq!(first.org, b);
        q.charge(&b, first.cpu);
        let second = q.pop().unwrap();
        assert_eq!(second.org, b, "4 < 8: b is still the less loaded");
        q.charge(&b, second.cpu);
        // Now 8 vs 8: round robin — a was served longest ago (never).
        assert_eq!(q.pop().unwrap().org, a);
        assert!(q.remove(&b_ids[2]));
        assert!(!q.remove(&b_ids[2]));
        assert_eq!(q.len(), 2);
        q.push(cand(&a_ids[1], &a, 0));
        assert_eq!(q.len(), 2, "a duplicate push is ignored");
    }

    #[test]
    fn a_refunded_charge_restores_the_order() {
        let (a, b) = (OrgId::new(), OrgId::new());
        let mut q = FairQueue::new();
        q.set_active_cpu(&a, 2);
        for org in [&a, &b, &b] {
            q.push(cand(&SandboxId::new(), org, 0));
        }
        let first = q.pop().unwrap();
        assert_eq!(first.org, b, "b runs nothing yet");
        q.charge(&b, 4);
        assert_eq!(
            q.pop().unwrap().org,
            a,
            "charged 4 > 2: a is now the less loaded"
        );
        q.push(first.clone());
        q.refund(&b, 4);
        assert_eq!(
            q.pop().unwrap().org,
            b,
            "the activation did not happen: b is back at 0"
        );
        q.refund(&b, 100);
        q.charge(&a, 0);
        assert_eq!(q.pop().unwrap().org, b, "a refund never goes below zero");
    }

    fn arb_queue() -> impl Strategy<Value = (Vec<(usize, i32, u64)>, Vec<u64>)> {
        // (org index, priority, cpu) per candidate; initial active CPU per org.
        (
            prop::collection::vec((0usize..6, -3i32..3, 1u64..8), 1..120),
            prop::collection::vec(0u64..40, 6),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every pick comes from an org with the least active CPU among orgs still waiting,
        /// so a less loaded org is never starved behind a busier one; every candidate comes
        /// out exactly once; inside an org, priority then age.
        #[test]
        fn picks_are_fair_complete_and_ordered((items, cpus) in arb_queue(), charge in any::<bool>()) {
            let orgs: Vec<OrgId> = (0..6).map(|_| OrgId::new()).collect();
            let mut q = FairQueue::new();
            let mut cpu: HashMap<OrgId, u64> = HashMap::new();
            for (i, org) in orgs.iter().enumerate() {
                q.set_active_cpu(org, cpus[i]);
                cpu.insert(org.clone(), cpus[i]);
            }
            let mut waiting: HashMap<OrgId, Vec<Candidate>> = HashMap::new();
            for (o, priority, c) in &items {
                let cand = Candidate { id: SandboxId::new(), org: orgs[*o].clone(), priority: *priority, cpu: *c };
                waiting.entry(cand.org.clone()).or_default().push(cand.clone());
                q.push(cand);
            }
            let mut popped = 0;
            while let Some(c) = q.pop() {
                popped += 1;
                let least = waiting.iter().filter(|(_, v)| !v.is_empty()).map(|(o, _)| cpu[o]).min().unwrap();
                prop_assert_eq!(cpu[&c.org], least, "picked a busier org");
                let list = waiting.get_mut(&c.org).unwrap();
                let best = list.iter().max_by(|x, y| x.priority.cmp(&y.priority).then_with(|| y.id.cmp(&x.id))).unwrap().clone();
                prop_assert_eq!(&best.id, &c.id, "not the highest-priority oldest of its org");
                list.retain(|x| x.id != c.id);
                if charge {
                    q.charge(&c.org, c.cpu);
                    *cpu.get_mut(&c.org).unwrap() += c.cpu;
                }
            }
            prop_assert_eq!(popped, items.len());
            prop_assert!(q.is_empty());
        }

        /// Orgs with equal load are served round-robin: between two picks of one org, every
        /// other org that was waiting all along was picked.
        #[test]
        fn equal_orgs_alternate(counts in prop::collection::vec(1usize..20, 2..6)) {
            let orgs: Vec<OrgId> = counts.iter().map(|_| OrgId::new()).collect();
            let mut q = FairQueue::new();
            for (org, n) in orgs.iter().zip(&counts) {
                for _ in 0..*n {
                    q.push(Candidate { id: SandboxId::new(), org: org.clone(), priority: 0, cpu: 1 });
                }
            }
            let mut order = Vec::new();
            while let Some(c) = q.pop() {
                order.push(c.org);
            }
            let rounds = *counts.iter().min().unwrap();
            // While every org still has work, each round contains each org once.
            for r in 0..rounds {
                let round: BTreeSet<_> = order[r * orgs.len()..(r + 1) * orgs.len()].iter().collect();
                prop_assert_eq!(round.len(), orgs.len());
            }
        }
    }
}
