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

/// The states a database can be in right after the crash: each step's status
/// and its invocations' statuses, in order.
fn step_states(store: &abridge::Store) -> Vec<(i64, i64, String, Vec<String>)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT t.idx, s.idx, s.status, \
                 (SELECT group_concat(status, ',') FROM (SELECT status FROM tool_invocations \
                  WHERE step_id = s.id ORDER BY position)) \
                 FROM steps s JOIN turns t ON t.id = s.turn_id ORDER BY t.idx, s.idx",
            )?;
            let rows = st.query_map([], |r| {
                let inv: Option<String> = r.get(3)?;
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    inv.map(|s| s.split(',').map(String::from).collect())
                        .unwrap_or_default(),
                ))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .unwrap()
}

/// Scenario: the last tool call of a step records its result, completes the
/// step and claims the next step in one transaction. A crash inside it, after
/// the result is written and before the commit, leaves none of the three: the
/// step is `responded` with its last call unrecorded and no next step exists.
/// The resumed run records the call once and ends at the control transcript.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_tool_result_step_completion_and_next_claim_commit_together() {
    let (_c, control, _) = run(None).await;
    let (_d, path) = temp_db();
    let store = open(&path);
    let crashing = demo_runner_with(
        &store,
        SEED,
        Threshold::Tokens(1_500),
        Some(fail_at(FaultPoint::BeforeStepComplete, 1)),
        EXTRAS,
        "runner",
    );
    let sid = demo_session(&crashing, SEED, 0).await;
    let input = abridge::demo::user_turn(SEED, 0, 0);
    let err = crashing.run_turn_at(sid, 0, &input).await.unwrap_err();
    assert!(matches!(err, abridge::Error::Injected(_)), "{err}");

    let states = step_states(&store);
    let (_, step_idx, status, invocations) = states.last().unwrap().clone();
    assert_eq!(status, "responded", "{states:?}");
    assert!(
        invocations
            .iter()
            .all(|s| s == "completed" || s == "failed")
            && invocations.len() < step_calls(&store, step_idx),
        "the last call's result must roll back with the completion: {states:?}"
    );

    let fresh = || {
        demo_runner_with(
            &store,
            SEED,
            Threshold::Tokens(1_500),
            None,
            EXTRAS,
            "runner",
        )
    };
    run_script(&fresh(), fresh, SEED, 0, TURNS).await;
    assert_eq!(transcript(&store, SEED, 0), transcript(&control, SEED, 0));
    assert_eq!(effects(&store), effects(&control));
    assert_verified(&store);
}

/// How many tool calls the response of turn 0's step `step_idx` made.
fn step_calls(store: &abridge::Store, step_idx: i64) -> usize {
    store
        .with_conn(|c| {
            let json: String = c.query_row(
                "SELECT s.response FROM steps s JOIN turns t ON t.id = s.turn_id \
                 WHERE t.idx = 0 AND s.idx = ?1",
                [step_idx],
                |r| r.get(0),
            )?;
            let r: abridge::ModelResponse = serde_json::from_str(&json).unwrap();
            Ok(r.tool_calls().count())
        })
        .unwrap()
}

/// Scenario: a running turn whose newest step is completed and whose next step
/// was never claimed (the layout of a database where completing a step did not
/// also claim the next one). Resuming claims the next step with a write of its
/// own and finishes the turn as the control run did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_without_a_claimed_next_step_resumes() {
    let (_c, control, _) = run(None).await;
    let (_d, path) = temp_db();
    let store = open(&path);
    let crashing = demo_runner_with(
        &store,
        SEED,
        Threshold::Tokens(1_500),
        Some(fail_at(FaultPoint::BeforeModelCall, 2)),
        EXTRAS,
        "runner",
    );
    let sid = demo_session(&crashing, SEED, 0).await;
    let input = abridge::demo::user_turn(SEED, 0, 0);
    crashing.run_turn_at(sid, 0, &input).await.unwrap_err();
    let removed = store
        .with_conn(|c| {
            Ok(c.execute(
                "DELETE FROM steps WHERE status = 'running' AND idx > 0 \
                 AND NOT EXISTS (SELECT 1 FROM tool_invocations WHERE step_id = steps.id)",
                [],
            )?)
        })
        .unwrap();
    assert_eq!(removed, 1, "{:?}", step_states(&store));
    assert_eq!(step_states(&store).last().unwrap().2, "completed");

    let fresh = || {
        demo_runner_with(
            &store,
            SEED,
            Threshold::Tokens(1_500),
            None,
            EXTRAS,
            "runner",
        )
    };
    run_script(&fresh(), fresh, SEED, 0, TURNS).await;
    assert_eq!(transcript(&store, SEED, 0), transcript(&control, SEED, 0));
    assert_verified(&store);
}
