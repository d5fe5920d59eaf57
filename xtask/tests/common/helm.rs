//! The chart rendered by Helm's engine (xtask::helm), or a skip where the SDK is missing.

use serde_json::Value;
use xtask::chart::CHART_DIR;
use xtask::helm::{self, Error, Rendering};

use super::repo;

/// The release name and namespace the README's `helm install` uses: the object names are then
/// config/default's.
pub const RELEASE: &str = "memcached-operator";
pub const NAMESPACE: &str = "memcached-operator-system";

/// What Helm answers for `values`: `Ok(None)` when helm-python-sdk is not installed, after printing a
/// `skipped:` line. Under CI (`CI` set) a missing SDK fails the test: .ci/run installs it.
pub fn try_render(values: Value) -> Result<Option<Rendering>, Error> {
    match helm::render(&repo(CHART_DIR), &values, RELEASE, NAMESPACE) {
        Err(Error::Unavailable(reason)) => {
            skip(&reason);
            Ok(None)
        }
        other => other.map(Some),
    }
}

/// The rendering of `values`, which must succeed; `None` when skipped.
pub fn render(values: Value) -> Option<Rendering> {
    try_render(values.clone())
        .unwrap_or_else(|e| panic!("the chart must render with {values}: {e}"))
}

/// The message Helm refuses `values` with; `None` when skipped.
pub fn refusal(values: Value) -> Option<String> {
    match try_render(values.clone()) {
        Ok(None) => None,
        Ok(Some(_)) => panic!("the chart must refuse {values}"),
        Err(Error::Refused(message)) => Some(message),
        Err(e) => panic!("{values}: {e}"),
    }
}

/// Prints why a Helm test is skipped; fails under CI.
pub fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "helm-python-sdk is needed for the chart tests under CI (.ci/run installs it): {reason}"
    );
    eprintln!("skipped: {reason}");
}

/// The objects of a rendering, crds/ (empty) and templates together, as `helm install` creates them.
pub fn installed(rendering: &Rendering) -> Vec<Value> {
    let mut objects = rendering.crd_objects().unwrap();
    objects.extend(rendering.objects().unwrap());
    objects
}

/// The one object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}
