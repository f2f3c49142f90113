//! Crash injected at every named point of a step and of a compaction.
//!
//! Scenario: a control run executes a scripted multi-session workload with no
//! fault. For each fault point and for several occurrences of it, the same
//! workload runs on a fresh database with a hook that fails the runner at
//! exactly that point (as a crash would: nothing cleaned up), then a new runner
//! resumes the turn. Afterwards: the transcript equals the control run's, every
//! transactional effect was applied exactly once (the effect set equals the
//! control's, and `verify` finds no duplicate), each idempotent tool's key was
//! seen with no different arguments, and every executed step's rebuilt hash
//! equals its recorded one.

mod common;
use abridge::{FaultPoint, Threshold};
use common::*;

const SEED: u64 = 11;
const TURNS: u64 = 12;
const EXTRAS: &[&str] = &["notify_customer"];

/// Runs the script on a fresh store; with `fault`, the first runner fails at the
/// `nth` time it reaches the point and a new runner resumes. Returns the faults seen.
async fn run(fault: Option<(FaultPoint, usize)>) -> (tempfile::TempDir, abridge::Store, usize) {
    let (d, path) = temp_db();
    let store = open(&path);
    let hook = fault.map(|(point, nth)| fail_at(point, nth));
    let runner = |hook| {
        demo_runner_with(
            &store,
            SEED,
            Threshold::Tokens(1_500),
            hook,
            EXTRAS,
            "runner",
        )
    };
    let faults = run_script(&runner(hook), || runner(None), SEED, 0, TURNS).await;
    (d, store, faults)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_at_every_point_resumes_to_the_control_transcript() {
    let (_c, control, faults) = run(None).await;
    assert_eq!(faults, 0);
    let want = transcript(&control, SEED, 0);
    let want_effects = effects(&control);
    assert_verified(&control);
    for point in FaultPoint::ALL {
        for nth in [1, 2, 5] {
            let (_d, store, faults) = run(Some((point, nth))).await;
            assert_eq!(faults, 1, "{point} #{nth} was never reached");
            assert_eq!(
                transcript(&store, SEED, 0),
                want,
                "{point} #{nth}: transcript differs"
            );
            assert_eq!(
                effects(&store),
                want_effects,
                "{point} #{nth}: effects differ"
            );
            assert_verified(&store);
            assert!(assert_all_steps_rebuild(&store) > 0);
        }
    }
}
