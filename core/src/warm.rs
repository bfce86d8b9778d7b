//! Warm classes: per pool, kinds of instance created ahead of time and never used, so that a
//! create matching one is answered from a ready instance instead of a backend create.
//!
//! A class fixes only what cannot change once an instance exists: its template (image) and
//! its resources. Everything else a create asks for (env, labels, TTL, idle policy, project,
//! priority) is applied when the instance is claimed, so it never takes part in matching.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::sandbox::FROM_SNAPSHOT_LABEL;
use crate::{FieldError, Resources, SandboxSpec};

/// Most classes one pool may declare (each is a refill loop and a row of counts).
pub const MAX_CLASSES: usize = 64;
/// Upper bound on `size` and `maxSize`: instances of one class kept warm.
pub const MAX_SIZE: u32 = 1000;
/// Upper bound on `refillPerSecond`.
pub const MAX_REFILL_PER_SECOND: f64 = 100.0;
/// Bounds on `maxAgeSeconds`: a minute to a week.
pub const MIN_MAX_AGE_SECONDS: u64 = 60;
/// The upper bound of `maxAgeSeconds`.
pub const MAX_MAX_AGE_SECONDS: u64 = 7 * 24 * 3600;
/// `maxAgeSeconds` when a class gives none.
pub const DEFAULT_MAX_AGE_SECONDS: u64 = 3600;

fn default_max_age() -> u64 {
    DEFAULT_MAX_AGE_SECONDS
}

/// One warm class of a pool: how many instances to keep ready and what they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmClass {
    /// `[a-z0-9][a-z0-9-]{0,62}`, unique within the pool.
    pub name: String,
    /// Instances kept `creating` or `ready`.
    pub size: u32,
    /// Ready instances above which the surplus is retired (`None`: `size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u32>,
    /// Creates started per second at most while refilling.
    pub refill_per_second: f64,
    /// A ready instance older than this is retired and replaced (backends age them too).
    #[serde(default = "default_max_age")]
    pub max_age_seconds: u64,
    /// The template the instances run; `None`: the pool's default, i.e. what a create that
    /// names no template gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The instances' resources; `None`: what a create asking for none gets
    /// (`Resources::DEFAULT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(inline)]
    pub resources: Option<Resources>,
}

impl WarmClass {
    /// The resources its instances have (and a matching create must ask for).
    pub fn effective_resources(&self) -> Resources {
        self.resources.unwrap_or(Resources::DEFAULT)
    }

    /// Ready instances kept at most: `maxSize`, else `size`.
    pub fn effective_max_size(&self) -> u32 {
        self.max_size.unwrap_or(self.size)
    }

    /// Whether a create with `spec` can be answered by an instance of this class: same
    /// template and same resources, and not a restore or fork (those start from a snapshot
    /// on the pool that holds it, never from a blank instance).
    pub fn matches(&self, spec: &SandboxSpec) -> bool {
        !from_snapshot(spec)
            && spec.template == self.template
            && spec.resources == self.effective_resources()
    }

    /// Checks every field; errors name it under `prefix` (e.g. `classes[1]`).
    fn validate(&self, prefix: &str) -> Result<(), FieldError> {
        let field = |f: &str| format!("{prefix}.{f}");
        if !valid_name(&self.name) {
            return Err(FieldError::new(
                field("name"),
                "must be 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit",
            ));
        }
        if self.size > MAX_SIZE {
            return Err(FieldError::new(
                field("size"),
                format!("must be between 0 and {MAX_SIZE}"),
            ));
        }
        if let Some(max) = self.max_size {
            if max < self.size || max > MAX_SIZE {
                return Err(FieldError::new(
                    field("maxSize"),
                    format!("must be between size ({}) and {MAX_SIZE}", self.size),
                ));
            }
        }
        let r = self.refill_per_second;
        if !r.is_finite() || r <= 0.0 || r > MAX_REFILL_PER_SECOND {
            return Err(FieldError::new(
                field("refillPerSecond"),
                format!("must be a number above 0 and at most {MAX_REFILL_PER_SECOND}"),
            ));
        }
        if !(MIN_MAX_AGE_SECONDS..=MAX_MAX_AGE_SECONDS).contains(&self.max_age_seconds) {
            return Err(FieldError::new(
                field("maxAgeSeconds"),
                format!("must be between {MIN_MAX_AGE_SECONDS} and {MAX_MAX_AGE_SECONDS}"),
            ));
        }
        if let Some(t) = &self.template {
            // As a create's template: a class must be able to match some create.
            if t.is_empty() || t.chars().count() > 512 || t.contains('\0') {
                return Err(FieldError::new(
                    field("template"),
                    "must be 1-512 characters without NUL",
                ));
            }
        }
        if let Some(res) = &self.resources {
            res.validate(&field("resources"))?;
        }
        Ok(())
    }
}

/// `[a-z0-9][a-z0-9-]{0,62}`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Whether `spec` is a restore or fork (it starts from a snapshot).
fn from_snapshot(spec: &SandboxSpec) -> bool {
    spec.pinned_pool.is_some() || spec.labels.contains_key(FROM_SNAPSHOT_LABEL)
}

/// A pool's warm classes, the document an operator puts (`{"classes": [...]}`); order
/// matters: the first class a create matches is the one it claims from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WarmClasses {
    #[serde(default)]
    pub classes: Vec<WarmClass>,
}

impl WarmClasses {
    /// Checks every class; the error names the first bad field (`classes[1].size`), so the
    /// API answers 422 with `details.field`.
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.classes.len() > MAX_CLASSES {
            return Err(FieldError::new(
                "classes",
                format!("at most {MAX_CLASSES} classes per pool"),
            ));
        }
        let mut names = HashSet::new();
        for (i, class) in self.classes.iter().enumerate() {
            let prefix = format!("classes[{i}]");
            class.validate(&prefix)?;
            if !names.insert(class.name.as_str()) {
                return Err(FieldError::new(
                    format!("{prefix}.name"),
                    format!("another class of this pool is named {}", class.name),
                ));
            }
        }
        Ok(())
    }

    /// The class named `name`.
    pub fn get(&self, name: &str) -> Option<&WarmClass> {
        self.classes.iter().find(|c| c.name == name)
    }

    /// The class a create with `spec` claims from ([`class_for`]).
    pub fn class_for(&self, spec: &SandboxSpec) -> Option<&WarmClass> {
        class_for(&self.classes, spec)
    }
}

/// The first class in `classes` (document order) that a create with `spec` matches
/// ([`WarmClass::matches`]), if any.
pub fn class_for<'a>(classes: &'a [WarmClass], spec: &SandboxSpec) -> Option<&'a WarmClass> {
    classes.iter().find(|c| c.matches(spec))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::CreateSandboxRequest;

    fn class(name: &str) -> WarmClass {
        WarmClass {
            name: name.to_owned(),
            size: 2,
            max_size: None,
            refill_per_second: 1.0,
            max_age_seconds: DEFAULT_MAX_AGE_SECONDS,
            template: None,
            resources: None,
        }
    }

    fn default_create() -> SandboxSpec {
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap()
    }

    fn field_of(classes: Vec<WarmClass>) -> String {
        WarmClasses { classes }.validate().unwrap_err().field
    }

    #[test]
    fn json_is_camel_case_with_defaults() {
        let doc: WarmClasses = serde_json::from_str(
            r#"{"classes":[{"name":"py","size":3,"maxSize":5,"refillPerSecond":2.5,
                "template":"python:3.12","resources":{"cpu":2,"memoryMiB":2048,"diskGiB":5}},
               {"name":"small","size":1,"refillPerSecond":1}]}"#,
        )
        .unwrap();
        assert_eq!(doc.classes[0].max_size, Some(5));
        assert_eq!(doc.classes[0].template.as_deref(), Some("python:3.12"));
        assert_eq!(doc.classes[1].max_age_seconds, DEFAULT_MAX_AGE_SECONDS);
        assert_eq!(doc.classes[1].effective_max_size(), 1);
        assert_eq!(doc.classes[1].effective_resources(), Resources::DEFAULT);
        assert_eq!(doc.validate(), Ok(()));
        let back = serde_json::to_value(&doc).unwrap();
        assert_eq!(back["classes"][0]["refillPerSecond"], 2.5);
        assert_eq!(back["classes"][0]["maxAgeSeconds"], 3600);
        assert_eq!(back["classes"][1].get("maxSize"), None);
        assert_eq!(serde_json::from_value::<WarmClasses>(back).unwrap(), doc);
        assert!(serde_json::from_str::<WarmClasses>(
            r#"{"classes":[{"name":"a","size":1,"refillPerSecond":1,"bogus":1}]}"#
        )
        .is_err());
    }

    #[test]
    fn invalid_fields_are_named_with_their_index() {
        let mut bad = class("b");
        bad.size = MAX_SIZE + 1;
        assert_eq!(field_of(vec![class("a"), bad]), "classes[1].size");

        let mut bad = class("a");
        bad.max_size = Some(1);
        assert_eq!(field_of(vec![bad]), "classes[0].maxSize");

        for r in [0.0, -1.0, f64::NAN, f64::INFINITY, 100.5] {
            let mut bad = class("a");
            bad.refill_per_second = r;
            assert_eq!(field_of(vec![bad]), "classes[0].refillPerSecond", "{r}");
        }
        for age in [0, 59, MAX_MAX_AGE_SECONDS + 1] {
            let mut bad = class("a");
            bad.max_age_seconds = age;
            assert_eq!(field_of(vec![bad]), "classes[0].maxAgeSeconds", "{age}");
        }
        for name in ["", "-a", "A", "a_b", &"a".repeat(64)] {
            assert_eq!(field_of(vec![class(name)]), "classes[0].name", "{name:?}");
        }
        assert_eq!(
            field_of(vec![class("a"), class("b"), class("a")]),
            "classes[2].name"
        );
        let mut bad = class("a");
        bad.template = Some(String::new());
        assert_eq!(field_of(vec![bad]), "classes[0].template");
        let mut bad = class("a");
        bad.resources = Some(Resources {
            cpu: 0,
            ..Resources::DEFAULT
        });
        assert_eq!(field_of(vec![bad]), "classes[0].resources.cpu");
        let many = (0..=MAX_CLASSES).map(|i| class(&format!("c{i}"))).collect();
        assert_eq!(field_of(many), "classes");
    }

    #[test]
    fn the_bounds_themselves_are_valid() {
        let mut c = class(&format!("0{}", "a-".repeat(31)));
        c.size = MAX_SIZE;
        c.max_size = Some(MAX_SIZE);
        c.refill_per_second = MAX_REFILL_PER_SECOND;
        c.max_age_seconds = MIN_MAX_AGE_SECONDS;
        let mut d = class("0");
        d.size = 0;
        d.max_age_seconds = MAX_MAX_AGE_SECONDS;
        assert_eq!(
            WarmClasses {
                classes: vec![c, d]
            }
            .validate(),
            Ok(())
        );
    }

    #[test]
    fn a_class_without_match_fields_matches_exactly_the_default_create() {
        let c = class("default");
        assert!(c.matches(&default_create()));
        let asks = [
            r#"{"template":"python:3.12"}"#,
            r#"{"resources":{"cpu":2}}"#,
            r#"{"profile":"medium"}"#,
            r#"{"resources":{"diskGiB":6}}"#,
        ];
        for json in asks {
            let req: CreateSandboxRequest = serde_json::from_str(json).unwrap();
            let spec = SandboxSpec::build(&req).unwrap();
            assert!(!c.matches(&spec), "{json}");
        }
        // `small` is the default's size, so it is the same create.
        let req: CreateSandboxRequest = serde_json::from_str(r#"{"profile":"small"}"#).unwrap();
        assert!(c.matches(&SandboxSpec::build(&req).unwrap()));
    }

    #[test]
    fn restores_and_forks_never_match() {
        let c = class("default");
        let mut pinned = default_create();
        pinned.pinned_pool = Some("p".to_owned());
        assert!(!c.matches(&pinned));
        let mut labelled = default_create();
        labelled
            .labels
            .insert(FROM_SNAPSHOT_LABEL.to_owned(), "snap_x".to_owned());
        assert!(!c.matches(&labelled));
    }

    // Property tests over small alphabets, so that equal and unequal values both occur often.

    const TEMPLATES: [Option<&str>; 3] = [None, Some("python:3.12"), Some("node:22")];

    fn template() -> impl Strategy<Value = Option<String>> {
        proptest::sample::select(TEMPLATES.to_vec()).prop_map(|t| t.map(str::to_owned))
    }

    fn resources() -> impl Strategy<Value = Resources> {
        (1u32..=2, prop_oneof![Just(1024u64), Just(2048)], 5u64..=6).prop_map(
            |(cpu, memory_mib, disk_gib)| Resources {
                cpu,
                memory_mib,
                disk_gib,
            },
        )
    }

    fn arb_class() -> impl Strategy<Value = WarmClass> {
        (
            "[a-z]{1,3}",
            template(),
            proptest::option::of(resources()),
            0u32..5,
        )
            .prop_map(|(name, template, resources, size)| WarmClass {
                template,
                resources,
                size,
                ..class(&name)
            })
    }

    /// What a create may vary besides template and resources.
    #[derive(Debug, Clone)]
    struct Rest {
        env: BTreeMap<String, String>,
        labels: BTreeMap<String, String>,
        ttl_seconds: u64,
        idle_timeout_seconds: Option<u64>,
        priority: i32,
    }

    fn rest() -> impl Strategy<Value = Rest> {
        (
            proptest::collection::btree_map("[A-Z]{1,3}", "[a-z0-9]{0,4}", 0..3),
            proptest::collection::btree_map("[a-z]{1,3}", "[a-z0-9]{0,4}", 0..3),
            1u64..100_000,
            proptest::option::of(1u64..10_000),
            -100i32..=100,
        )
            .prop_map(
                |(env, labels, ttl_seconds, idle_timeout_seconds, priority)| Rest {
                    env,
                    labels,
                    ttl_seconds,
                    idle_timeout_seconds,
                    priority,
                },
            )
    }

    fn spec(template: Option<String>, resources: Resources, rest: &Rest) -> SandboxSpec {
        SandboxSpec {
            template,
            resources,
            env: rest.env.clone(),
            labels: rest.labels.clone(),
            ttl_seconds: rest.ttl_seconds,
            idle_timeout_seconds: rest.idle_timeout_seconds,
            priority: rest.priority,
            ..default_create()
        }
    }

    proptest! {
        #[test]
        fn a_create_matches_only_when_template_and_resources_are_equal(
            c in arb_class(), t in template(), r in resources(), rest in rest(),
        ) {
            let s = spec(t.clone(), r, &rest);
            let equal = t == c.template && r == c.effective_resources();
            prop_assert_eq!(c.matches(&s), equal);
            prop_assert_eq!(class_for(std::slice::from_ref(&c), &s).is_some(), equal);
        }

        #[test]
        fn env_labels_ttl_idle_and_priority_never_affect_matching(
            classes in proptest::collection::vec(arb_class(), 0..5),
            t in template(), r in resources(), a in rest(), b in rest(),
        ) {
            let one = class_for(&classes, &spec(t.clone(), r, &a)).map(|c| &c.name);
            let other = class_for(&classes, &spec(t, r, &b)).map(|c| &c.name);
            prop_assert_eq!(one, other);
        }

        #[test]
        fn restores_and_forks_match_no_class(
            classes in proptest::collection::vec(arb_class(), 0..5),
            t in template(), r in resources(), rest in rest(), pinned in any::<bool>(),
        ) {
            let mut s = spec(t, r, &rest);
            if pinned {
                s.pinned_pool = Some("p".to_owned());
            } else {
                s.labels.insert(FROM_SNAPSHOT_LABEL.to_owned(), "snap".to_owned());
            }
            prop_assert!(class_for(&classes, &s).is_none());
        }

        #[test]
        fn the_first_match_in_document_order_wins(
            classes in proptest::collection::vec(arb_class(), 0..6),
            t in template(), r in resources(), rest in rest(),
        ) {
            let s = spec(t, r, &rest);
            let found = class_for(&classes, &s).map(|c| c as *const WarmClass);
            let first = classes
                .iter()
                .position(|c| c.matches(&s))
                .map(|i| &classes[i] as *const WarmClass);
            prop_assert_eq!(found, first);
        }

        #[test]
        fn a_class_with_no_match_fields_matches_only_the_default(
            t in template(), r in resources(), rest in rest(),
        ) {
            let c = class("d");
            let s = spec(t.clone(), r, &rest);
            prop_assert_eq!(c.matches(&s), t.is_none() && r == Resources::DEFAULT);
        }
    }
}
