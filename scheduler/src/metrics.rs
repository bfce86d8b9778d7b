//! Scheduler metrics that need a little state: the per-org queue-depth gauge, whose label
//! set is capped so a flood of tenants cannot blow up the exporter.

use std::collections::{HashMap, HashSet};

use differently_core::OrgId;

/// Orgs with their own `differently_queue_depth` series; the rest are summed as `other`.
pub(crate) const MAX_ORG_LABELS: usize = 100;

/// Remembers which org series were set, so orgs whose queue emptied drop to zero.
#[derive(Default)]
pub(crate) struct QueueDepth {
    shown: HashSet<String>,
}

impl QueueDepth {
    /// Sets `differently_queue_depth{org}` from this pass's counts: the deepest
    /// [`MAX_ORG_LABELS`] orgs by name, everything else under `org="other"`.
    pub(crate) fn publish(&mut self, counts: &HashMap<OrgId, usize>) {
        let labels = top_labels(counts, MAX_ORG_LABELS);
        let mut now: HashSet<String> = HashSet::new();
        for (label, n) in labels {
            metrics::gauge!("differently_queue_depth", "org" => label.clone()).set(n as f64);
            now.insert(label);
        }
        for gone in self.shown.difference(&now) {
            metrics::gauge!("differently_queue_depth", "org" => gone.clone()).set(0.0);
        }
        self.shown = now;
    }
}

/// The `max` deepest orgs by name plus `other` for the rest. `other` is always there (zero
/// when no org is left over), so the series exists from the first pass and a dashboard
/// or alert on it never reads "no data" for an idle queue.
pub(crate) fn top_labels(counts: &HashMap<OrgId, usize>, max: usize) -> Vec<(String, usize)> {
    let mut all: Vec<(String, usize)> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(o, n)| (o.to_string(), *n))
        .collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: usize = all.iter().skip(max).map(|(_, n)| n).sum();
    all.truncate(max);
    all.push(("other".to_owned(), rest));
    all
}

/// Counts one sweep or reconcile action (`differently_reconcile_actions_total{pool,action}`);
/// the same `action` is on the log line.
pub(crate) fn reconcile_action(pool: &str, action: &'static str) {
    metrics::counter!("differently_reconcile_actions_total", "pool" => pool.to_owned(), "action" => action)
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_capped_with_the_rest_as_other() {
        let orgs: Vec<OrgId> = (0..5).map(|_| OrgId::new()).collect();
        let counts: HashMap<OrgId, usize> = orgs
            .iter()
            .enumerate()
            .map(|(i, o)| (o.clone(), i + 1))
            .collect();
        let labels = top_labels(&counts, 2);
        assert_eq!(labels.len(), 3);
        assert_eq!(labels[0], (orgs[4].to_string(), 5));
        assert_eq!(labels[1], (orgs[3].to_string(), 4));
        assert_eq!(labels[2], ("other".to_owned(), 1 + 2 + 3));
        let all = top_labels(&counts, 10);
        assert_eq!(all.len(), 6);
        assert_eq!(all[5], ("other".to_owned(), 0));
        assert_eq!(
            top_labels(&HashMap::new(), 10),
            vec![("other".to_owned(), 0)]
        );
    }
}
