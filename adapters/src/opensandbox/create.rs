//! The body of `POST /sandboxes` for a Differently sandbox, per runtime.

use std::collections::BTreeMap;

use super::config::{Egress, Ports, Runtime};
use super::lifecycle::{self, META_INSTALLATION, META_SANDBOX};
use super::{OpenSandboxAdapter, ENTRYPOINT};
use crate::{AdapterError, CreateInstance};

impl OpenSandboxAdapter {
    pub(super) fn image_for(&self, req: &CreateInstance) -> String {
        match self.settings.runtime {
            Runtime::Fastsandbox => self.settings.template_id.clone().unwrap_or_default(),
            _ => req
                .template
                .clone()
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| self.settings.image.clone()),
        }
    }

    pub(super) fn create_body(
        &self,
        req: &CreateInstance,
    ) -> Result<lifecycle::CreateBody, AdapterError> {
        let s = &self.settings;
        let mut body = lifecycle::CreateBody {
            metadata: BTreeMap::from([
                (META_SANDBOX.to_owned(), req.sandbox_id.as_str().to_owned()),
                (
                    META_INSTALLATION.to_owned(),
                    req.installation_id.as_str().to_owned(),
                ),
            ]),
            ..Default::default()
        };
        let limits = BTreeMap::from([
            ("cpu".to_owned(), req.resources.cpu.to_string()),
            (
                "memory".to_owned(),
                format!("{}Mi", req.resources.memory_mib),
            ),
        ]);
        let ttl = (req.ttl_seconds > 0).then(|| req.ttl_seconds.max(60));
        if s.runtime == Runtime::Fastsandbox {
            if !req.env.is_empty() {
                return Err(AdapterError::permanent(
                    "Fast Sandbox templates fix the environment: bake env into the template"
                        .to_owned(),
                ));
            }
            body.timeout = Some(ttl.unwrap_or(s.default_timeout_seconds));
            match &req.from_snapshot {
                Some(snap) => {
                    body.snapshot_id = Some(snap.clone());
                    // A restore has no template to size it: the SandboxPool's size.
                    body.resource_limits = match (&s.pool_cpu, &s.pool_memory) {
                        (Some(cpu), Some(mem)) => Some(BTreeMap::from([
                            ("cpu".to_owned(), cpu.clone()),
                            ("memory".to_owned(), mem.clone()),
                        ])),
                        _ => Some(limits),
                    };
                }
                None => {
                    if let Some(t) = req.template.as_deref().filter(|t| !t.is_empty()) {
                        if Some(t) != s.template_id.as_deref() {
                            return Err(AdapterError::permanent(format!(
                                "this pool serves only its own Fast Sandbox template, not `{t}`"
                            )));
                        }
                    }
                    body.template_id = s.template_id.clone();
                }
            }
        } else {
            body.timeout = ttl;
            body.resource_limits = Some(limits);
            body.env = req.env.clone();
            match &req.from_snapshot {
                Some(snap) => body.snapshot_id = Some(snap.clone()),
                None => {
                    body.image = Some(lifecycle::ImageSpec {
                        uri: self.image_for(req),
                    });
                    body.entrypoint = Some(ENTRYPOINT.iter().map(|s| (*s).to_owned()).collect());
                }
            }
            body.secure_access = s.ports == Ports::Signed;
        }
        body.network_policy = match s.egress {
            Egress::Public => None,
            Egress::None | Egress::Allowlist => Some(lifecycle::NetworkPolicy {
                default_action: "deny",
                egress: s
                    .egress_allow
                    .iter()
                    .map(|h| lifecycle::EgressRule {
                        action: "allow",
                        target: h.clone(),
                    })
                    .collect(),
            }),
        };
        Ok(body)
    }
}
