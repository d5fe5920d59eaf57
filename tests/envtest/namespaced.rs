//! The namespaced install on a real server: `config/namespaced` gives the operator a Role in its own
//! namespace and no ClusterRole but metrics-auth-role (reviews only), and it runs an instance there to
//! `Available` with no request refused.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use crate::instances::{apply, wait_settled};
use crate::{Scenario, wait_for};

#[tokio::test]
async fn the_namespaced_install_runs_an_instance_with_rights_in_its_namespace_only() {
    let Some(s) = Scenario::start_namespaced("namespaced").await else {
        return;
    };
    let user = s.credentials.user.clone();

    // One ClusterRoleBinding names the operator's ServiceAccount: metrics-auth-role's, for the reviews
    // (cluster-scoped) that check who scrapes /metrics.
    let bindings = Api::<ClusterRoleBinding>::all(s.client.clone())
        .list(&ListParams::default())
        .await
        .expect("listing ClusterRoleBindings");
    let binding_names: Vec<String> = bindings
        .items
        .iter()
        .filter(|b| {
            b.subjects.iter().flatten().any(|subject| {
                subject.kind == "ServiceAccount"
                    && subject.name == s.credentials.service_account
                    && subject.namespace.as_deref() == Some(s.namespace.as_str())
            })
        })
        .filter_map(|b| b.metadata.name.clone())
        .collect();
    assert_eq!(
        binding_names,
        ["memcached-operator-metrics-auth-rolebinding"],
        "{binding_names:?}"
    );

    // What the API server's authorizer says the operator may do.
    let may = |verb: &'static str,
               (group, resource): (&'static str, &'static str),
               namespace: &str| {
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", s.namespace), "system:authenticated"],
                "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace},
            }
        }))
        .expect("a SubjectAccessReview");
        let client = s.client.clone();
        async move {
            Api::<SubjectAccessReview>::all(client)
                .create(&PostParams::default(), &review)
                .await
                .expect("a SubjectAccessReview")
                .status
                .is_some_and(|status| status.allowed)
        }
    };
    for (verb, resource) in [
        ("list", ("", "secrets")),
        ("get", ("", "secrets")),
        ("patch", ("apps", "deployments")),
    ] {
        assert!(
            may(verb, resource, &s.namespace).await,
            "{verb} {resource:?} in its own namespace"
        );
        assert!(
            !may(verb, resource, "default").await,
            "{verb} {resource:?} in another namespace"
        );
        assert!(
            !may(verb, resource, "").await,
            "{verb} {resource:?} in every namespace"
        );
    }
    s.step(
        "the operator's ServiceAccount may read Secrets and write workloads in its namespace only",
    );

    let accounts: Api<ServiceAccount> = Api::namespaced(s.client.clone(), &s.namespace);
    wait_for(
        "the namespace's default ServiceAccount",
        Duration::from_secs(30),
        || async {
            match accounts.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    apply(&s, "cache", json!({"size": 2})).await;
    wait_settled(&s, "cache", Duration::from_secs(90)).await;
    s.step("an instance in the operator's namespace settled");

    let refused = s.refused_requests();
    assert!(
        refused.is_empty(),
        "requests the namespaced install refused: {refused:?}"
    );
    s.step("no request of the operator was refused");
}
