//! Step 5: a second operator stays standby, then takes over after the first gets SIGTERM.

use std::time::Duration;

use crate::checks::check_ready_status;
use crate::env::{E2e, OpInfo};
use crate::events::{holder_contains, lease_holder};
use crate::kubectl::secs;
use crate::names::SAMPLE;

pub fn step_leader_handover(env: &E2e, first: &OpInfo) -> OpInfo {
    let (holder, lease_seconds) = lease_holder().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        holder.contains(&first.identity),
        "Lease holderIdentity {holder:?} should contain the first operator's POD_NAME {:?}",
        first.identity
    );
    eprintln!("    lease holder {holder:?}, leaseDurationSeconds {lease_seconds:?}");

    let second = env.start_operator("second");
    // The standby must serve its health probe: in a cluster, kubelet's liveness probe would otherwise
    // restart every non-leader replica.
    env.wait_http(&second, "/healthz", secs(60));

    env.hold(
        &format!(
            "Lease stays with the first operator ({}) while the second ({}) runs",
            first.identity, second.identity
        ),
        Duration::from_secs(20),
        || match lease_holder() {
            Ok((h, _)) if h.contains(&first.identity) && !h.contains(&second.identity) => Ok(()),
            Ok((h, _)) => Err(format!(
                "holderIdentity is {h:?}, expected the first operator's {:?}",
                first.identity
            )),
            Err(e) => {
                eprintln!("    (transient error reading the lease, ignored: {e})");
                Ok(())
            }
        },
    );

    let status = env.terminate(first, secs(15));
    assert!(
        status.success(),
        "the first operator exited with {status} after SIGTERM; a graceful shutdown must exit with 0 \
         (log: {})",
        first.log.display()
    );
    eprintln!("    ok: first operator exited with {status} after SIGTERM");

    // If the first operator released the lease on shutdown the second takes over at its next retry;
    // otherwise it has to wait for the lease to expire.
    let handover = secs(30).max(Duration::from_secs(
        u64::try_from(lease_seconds.unwrap_or(15)).unwrap_or(15) + 15,
    ));
    env.wait(
        &format!(
            "the second operator ({}) to become the Lease holder",
            second.identity
        ),
        handover,
        || holder_contains(&second.identity),
    );
    env.wait_http(&second, "/readyz", secs(60));
    env.wait(
        &format!("Memcached {SAMPLE} to stay ready under the new leader"),
        secs(60),
        || check_ready_status(&env.ns, SAMPLE, 1),
    );
    second
}
