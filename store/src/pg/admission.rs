//! Admission of new sandboxes (the group commit is `admission_lanes`).

use async_trait::async_trait;

use super::{admission_lanes, PgStore};
use crate::prelude::*;
use crate::{Admission, Admitted, StoreError};

#[async_trait]
impl AdmissionStore for PgStore {
    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError> {
        admission_lanes::admit(self, admission).await
    }

    async fn admit_many(&self, group: Vec<Admission>) -> Vec<Result<Admitted, StoreError>> {
        admission_lanes::admit_many(self, group).await
    }
}
