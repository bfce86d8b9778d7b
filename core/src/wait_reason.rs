//! The stored reason a queued sandbox waits, for the readers that act on it: the warm refill
//! gives no room to a pool tenants wait for, and a warm claim on a capped pool may not overtake
//! them. Writers and readers both go through this module, so a change of wording cannot
//! silently break a reader (the round trips are tested here).

/// How the policy's "no pool can take it now" reason starts; it goes on with each waited-for
/// pool as `<pool> (<why>)`, separated by `; ` (pool names are `a-z`, `0-9` and `-`).
const CAPACITY: &str = "waiting for capacity: ";
/// How an activation refused by a full pool cap says so: `waiting: pool <name> full n/m`.
const POOL_FULL: &str = "waiting: pool ";
/// How a quota wait starts (`waiting: org …`, `waiting: project …`).
const QUOTA: [&str; 2] = ["waiting: org ", "waiting: project "];

/// Why a queued sandbox waits, as far as pool capacity is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waits<'a> {
    /// For capacity of these pools (any of them would do).
    Capacity(Vec<&'a str>),
    /// For its organization's or project's quota: no pool's capacity would let it run now.
    Quota,
    /// Not decided yet (no reason) or anything else: it may want any pool.
    Undecided,
}

/// The reason of a create that waits for the capacity of `pools`, each with why it cannot
/// take it now (`full 3/3`, `unhealthy`).
pub fn capacity<'a>(pools: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let parts: Vec<String> = pools
        .into_iter()
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    format!("{CAPACITY}{}", parts.join("; "))
}

/// The reason of an activation refused by `pool`'s cap.
pub fn pool_full(pool: &str, used: u64, max: u32) -> String {
    format!("{POOL_FULL}{pool} full {used}/{max}")
}

/// What a stored reason (`None`: none yet) says the sandbox waits for.
pub fn waits(reason: Option<&str>) -> Waits<'_> {
    let Some(reason) = reason else {
        return Waits::Undecided;
    };
    if let Some(rest) = reason.strip_prefix(CAPACITY) {
        let pools = rest
            .split("; ")
            .filter_map(|part| part.split_once(" (").map(|(pool, _)| pool))
            .collect();
        return Waits::Capacity(pools);
    }
    if let Some(rest) = reason.strip_prefix(POOL_FULL) {
        if let Some((pool, _)) = rest.split_once(" full ") {
            return Waits::Capacity(vec![pool]);
        }
    }
    if QUOTA.iter().any(|q| reason.starts_with(q)) {
        return Waits::Quota;
    }
    Waits::Undecided
}

/// The pools a stored reason says the sandbox waits for the capacity of (none for any other
/// reason).
pub fn pools_waited_for(reason: &str) -> Vec<&str> {
    match waits(Some(reason)) {
        Waits::Capacity(pools) => pools,
        _ => Vec::new(),
    }
}

/// Whether a queued sandbox with this reason may be waiting for `pool`'s capacity: it names
/// the pool, or nothing says it waits for something else (not decided yet, or a reason this
/// module does not know). A quota wait, or a capacity wait naming other pools only, does not.
pub fn may_want(reason: Option<&str>, pool: &str) -> bool {
    match waits(reason) {
        Waits::Capacity(pools) => pools.contains(&pool),
        Waits::Quota => false,
        Waits::Undecided => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_reasons_read_back() {
        let r = capacity([("fake", "full 2/2"), ("other-1", "unhealthy")]);
        assert_eq!(
            r,
            "waiting for capacity: fake (full 2/2); other-1 (unhealthy)"
        );
        assert_eq!(pools_waited_for(&r), ["fake", "other-1"]);
        let r = pool_full("p-2", 3, 3);
        assert_eq!(r, "waiting: pool p-2 full 3/3");
        assert_eq!(waits(Some(&r)), Waits::Capacity(vec!["p-2"]));
    }

    #[test]
    fn quota_waits_want_no_pool_and_unknown_ones_may_want_any() {
        for q in [
            "waiting: org active quota 1/1",
            "waiting: project cpu quota 8/8",
        ] {
            assert_eq!(waits(Some(q)), Waits::Quota);
            assert!(!may_want(Some(q), "p"));
            assert!(pools_waited_for(q).is_empty());
        }
        assert!(may_want(None, "p"), "not decided yet");
        assert!(may_want(Some("retrying after a failed create"), "p"));
        let r = capacity([("a", "full 1/1")]);
        assert!(may_want(Some(&r), "a"));
        assert!(!may_want(Some(&r), "b"));
    }

    #[test]
    fn the_accounting_writers_use_these_forms() {
        use crate::tenancy::{Quota, Usage};
        let used = Usage {
            active: 1,
            ..Usage::default()
        };
        let q = Quota {
            max_active: Some(1),
            ..Quota::default()
        };
        let r = used
            .blocks(&q, &crate::Resources::DEFAULT, "org")
            .expect("blocked");
        assert_eq!(waits(Some(&r)), Waits::Quota, "{r}");
        let r = used
            .blocks(&q, &crate::Resources::DEFAULT, "project")
            .expect("blocked");
        assert_eq!(waits(Some(&r)), Waits::Quota, "{r}");
    }
}
