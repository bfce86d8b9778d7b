//! Finding a provider's instances by the tags Differently puts on them. Every instance
//! carries the sandbox id and the installation id as tags (labels, metadata: whatever the
//! provider calls them), under the same two keys everywhere; that is how `create` stays
//! idempotent (look the sandbox id up before creating) and how `list` finds orphans.

use std::collections::BTreeMap;

use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::{CreateInstance, Instance, InstanceState};

/// The tag carrying Differently's sandbox id.
pub const SANDBOX_TAG: &str = "differently-sandbox-id";
/// The tag carrying the installation id.
pub const INSTALLATION_TAG: &str = "differently-installation-id";

/// The two tags of the instance `req` creates, to send with the create call.
pub fn create_tags(req: &CreateInstance) -> BTreeMap<String, String> {
    BTreeMap::from([
        (SANDBOX_TAG.to_owned(), req.sandbox_id.as_str().to_owned()),
        (
            INSTALLATION_TAG.to_owned(),
            req.installation_id.as_str().to_owned(),
        ),
    ])
}

/// A provider's record of one instance, as its list or get call answers it.
pub trait Tagged {
    /// The provider's own id of the instance ([`Instance::backend_ref`]).
    fn backend_ref(&self) -> &str;
    /// The value of tag `key`, if the record carries it.
    fn tag(&self, key: &str) -> Option<&str>;
    /// The instance's state in ours; `None` for one that is gone or going (deleted,
    /// being destroyed), which lookups skip.
    fn state(&self) -> Option<InstanceState>;
}

/// The [`Instance`] a record stands for; `None` when it carries no valid sandbox id or is
/// gone.
pub fn instance<T: Tagged>(record: &T) -> Option<Instance> {
    let sandbox_id = SandboxId::parse(record.tag(SANDBOX_TAG)?).ok()?;
    Some(Instance {
        backend_ref: record.backend_ref().to_owned(),
        sandbox_id,
        state: record.state()?,
    })
}

/// The live records tagged with `id`, in the order given (normally one). The provider's
/// own tag filter is not trusted alone: records it lets through are checked again here.
pub fn of_sandbox<T: Tagged>(records: Vec<T>, id: &SandboxId) -> Vec<T> {
    records
        .into_iter()
        .filter(|r| r.tag(SANDBOX_TAG) == Some(id.as_str()))
        .filter(|r| r.state().is_some())
        .collect()
}

/// The first of `records` (a lookup's answer) that stands for an instance: what `find`
/// answers.
pub fn first<T: Tagged>(records: &[T]) -> Option<Instance> {
    records.iter().find_map(instance)
}

/// The instances among `records` tagged with `installation` (live ones with a valid
/// sandbox id), ordered by sandbox id so a listing reads the same every time.
pub fn of_installation<T: Tagged>(records: &[T], installation: &InstallationId) -> Vec<Instance> {
    let mut out: Vec<Instance> = records
        .iter()
        .filter(|r| r.tag(INSTALLATION_TAG) == Some(installation.as_str()))
        .filter_map(instance)
        .collect();
    out.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rec {
        id: &'static str,
        tags: BTreeMap<String, String>,
        gone: bool,
    }

    impl Tagged for Rec {
        fn backend_ref(&self) -> &str {
            self.id
        }
        fn tag(&self, key: &str) -> Option<&str> {
            self.tags.get(key).map(String::as_str)
        }
        fn state(&self) -> Option<InstanceState> {
            (!self.gone).then_some(InstanceState::Running)
        }
    }

    fn rec(id: &'static str, sandbox: &str, installation: &str, gone: bool) -> Rec {
        let tags = BTreeMap::from([
            (SANDBOX_TAG.to_owned(), sandbox.to_owned()),
            (INSTALLATION_TAG.to_owned(), installation.to_owned()),
        ]);
        Rec { id, tags, gone }
    }

    #[test]
    fn lookups_check_the_tags_and_skip_gone_records() {
        let a = SandboxId::new();
        let b = SandboxId::new();
        let inst = InstallationId::new();
        let other = InstallationId::new();
        let records = vec![
            rec("r1", a.as_str(), inst.as_str(), false),
            rec("r2", a.as_str(), inst.as_str(), true),
            rec("r3", b.as_str(), other.as_str(), false),
            rec("r4", "not-an-id", inst.as_str(), false),
        ];
        let listed = of_installation(&records, &inst);
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            (listed[0].backend_ref.as_str(), &listed[0].sandbox_id),
            ("r1", &a)
        );
        let found: Vec<_> = of_sandbox(records, &a).into_iter().map(|r| r.id).collect();
        assert_eq!(found, ["r1"]);
    }
}
