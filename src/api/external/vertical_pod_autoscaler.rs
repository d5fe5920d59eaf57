//! The Kubernetes autoscaler project's VerticalPodAutoscaler (`autoscaling.k8s.io/v1`), a CRD: a test-only
//! kind of the table, the proof that a kind the cluster may not serve is one entry plus its builder.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

/// A VerticalPodAutoscaler: its metadata, and its spec as the API has it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct VerticalPodAutoscaler {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<serde_json::Value>,
}

/// With its `apiVersion` and `kind`, as k8s-openapi's types write theirs: an apply names what it applies.
impl Serialize for VerticalPodAutoscaler {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use k8s_openapi::Resource;
        let mut object = serializer.serialize_struct(Self::KIND, 4)?;
        object.serialize_field("apiVersion", Self::API_VERSION)?;
        object.serialize_field("kind", Self::KIND)?;
        object.serialize_field("metadata", &self.metadata)?;
        if let Some(spec) = &self.spec {
            object.serialize_field("spec", spec)?;
        }
        object.end()
    }
}

impl k8s_openapi::Resource for VerticalPodAutoscaler {
    const API_VERSION: &'static str = "autoscaling.k8s.io/v1";
    const GROUP: &'static str = "autoscaling.k8s.io";
    const KIND: &'static str = "VerticalPodAutoscaler";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "verticalpodautoscalers";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for VerticalPodAutoscaler {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
