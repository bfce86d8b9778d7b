//! Fair order of queued candidates: organizations with less active CPU first, interleaved
//! round-robin; inside one organization, higher priority first, then older first.

use std::collections::{BTreeMap, HashMap};

use crate::{OrgId, SandboxId};

/// A queued sandbox as the fair order sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: SandboxId,
    pub org: OrgId,
    pub priority: i32,
}

/// Orders `candidates` fairly, given each organization's active CPU.
/// Sandbox ids are ULIDs, so a smaller id is an older sandbox.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_org_first_then_round_robin_then_priority_and_age() {
        let (a, b) = (OrgId::new(), OrgId::new());
        let ids: Vec<SandboxId> = (0..4).map(|_| SandboxId::new()).collect();
        let cand = |i: usize, org: &OrgId, priority| Candidate {
            id: ids[i].clone(),
            org: org.clone(),
            priority,
        };
        let list = vec![
            cand(0, &a, 0),
            cand(1, &a, 5),
            cand(2, &a, 0),
            cand(3, &b, 0),
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
}
