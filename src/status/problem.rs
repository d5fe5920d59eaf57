//! What is wrong with an instance ([`Problem`]), as its conditions say it: from a spec the operator
//! cannot realise, or from what the workload and its pods report.

use crate::resources::InvalidSpec;

/// Something wrong, as a condition reason (CamelCase) and a message for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: String,
    pub message: String,
}

impl From<InvalidSpec> for Problem {
    fn from(e: InvalidSpec) -> Self {
        Self {
            reason: e.reason.to_owned(),
            message: e.message,
        }
    }
}
