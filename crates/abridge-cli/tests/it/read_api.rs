//! The read API gives a host everything the store holds about a session
//! without SQL: the same rows the store has, by id or external id.

use crate::common;
use abridge::{ExportFormat, SessionId, SessionKey, Threshold};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reads_back_through_the_api_as_stored() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let runner = demo_runner(&store, 5, Threshold::Tokens(600), None);
    let mut events = runner.subscribe();
    let sid = demo_session(&runner, 5, 0).await;
    for t in 0..8 {
        runner
            .run_turn_at(sid, t, &abridge_testkit::demo::user_turn(5, 0, t as u64))
            .await
            .unwrap();
    }
    let ext = abridge_testkit::demo::session_external_id(5, 0);
    let by_ext = store.session(ext.as_str()).await.unwrap();
    let by_id = runner.session(sid).await.unwrap();
    assert_eq!(by_ext, by_id);
    assert!(matches!(
        store.session("no-such-session").await,
        Err(abridge::Error::UnknownSession(s)) if s == "no-such-session"
    ));
    // A numeric external key is the external id, never a row id.
    assert!(store.session("1").await.is_err());
    assert_eq!(
        store.session(SessionKey::Id(SessionId(1))).await.unwrap(),
        by_id
    );

    let turns = store.turns(sid).await.unwrap();
    assert_eq!(turns.len(), 8);
    let (mut steps, mut calls) = (0, 0);
    for t in &turns {
        for s in store.steps(t.id).await.unwrap() {
            steps += 1;
            assert!(store.rebuild_step(s.id).await.unwrap().matches());
            for i in store.invocations(s.id).await.unwrap() {
                calls += 1;
                assert_eq!(i.step_id, s.id);
                assert_ne!(i.effect, abridge::store::Effect::None);
            }
        }
    }
    let counts = &store.sessions().await.unwrap()[0].counts;
    assert_eq!((steps, calls), (counts.steps, counts.tool_calls));
    let compactions = store.compactions(sid).await.unwrap();
    assert_eq!(compactions.len() as i64, counts.compactions_completed);
    assert!(!compactions.is_empty());
    for c in &compactions {
        assert!(c.tokens_after < c.tokens_before);
        assert_eq!(c.model.as_deref(), Some("abridge-extractive"));
    }
    let via_api = store.export(sid, ExportFormat::Jsonl).await.unwrap();
    let via_cli = store
        .with_conn(move |c| abridge::inspect::export(c, &ext, ExportFormat::Jsonl))
        .unwrap();
    assert_eq!(via_api, via_cli);
    assert!(store.verify(Vec::new()).await.unwrap().ok);
    // Each completed compaction was announced with what triggered it, by whom,
    // in which turn of which session.
    let compacted: Vec<abridge::Event> = common::drained(&mut events)
        .into_iter()
        .filter(|e| matches!(e.kind, abridge::EventKind::Compacted { .. }))
        .collect();
    assert_eq!(compacted.len(), compactions.len());
    for (e, row) in compacted.iter().zip(&compactions) {
        assert_eq!(
            e.subject.session,
            abridge_testkit::demo::session_external_id(5, 0)
        );
        assert!(e.subject.turn.is_some_and(|t| t > row.up_to_turn_index));
        match &e.kind {
            abridge::EventKind::Compacted {
                compaction_id,
                trigger_tokens,
                tokens_before,
                tokens_after,
                summariser_model,
                ..
            } => {
                assert_eq!(*compaction_id, row.id);
                assert_eq!(*trigger_tokens, row.trigger_tokens);
                assert!(trigger_tokens.is_some());
                assert_eq!(
                    (Some(*tokens_before), Some(*tokens_after)),
                    (row.tokens_before, row.tokens_after)
                );
                assert_eq!(summariser_model.as_deref(), Some("abridge-extractive"));
            }
            _ => unreachable!(),
        }
    }
}

/// `Store::view` is what the next turn reads: the newest completed
/// compaction, its summary as steps send it, and only the turns after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_is_the_newest_summary_and_the_turns_after_it() {
    let (_d, path) = temp_db();
    let store = open(&path);
    let runner = demo_runner(&store, 5, Threshold::Tokens(600), None);
    let sid = demo_session(&runner, 5, 0).await;
    let before = store.view(sid).await.unwrap();
    assert!(before.compaction.is_none() && before.summary_message.is_none());
    assert!(before.turns.is_empty());
    for t in 0..8 {
        runner
            .run_turn_at(sid, t, &abridge_testkit::demo::user_turn(5, 0, t as u64))
            .await
            .unwrap();
    }
    runner.finish_background().await;
    let view = store.view(sid).await.unwrap();
    let newest = store
        .compactions(sid)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.status == abridge::store::CompactionStatus::Completed)
        .max_by_key(|c| c.up_to_turn_index)
        .expect("the threshold was passed");
    let c = view.compaction.as_ref().unwrap();
    assert_eq!(c.id, newest.id);
    let text = view.summary_message.unwrap();
    assert_eq!(
        text,
        abridge::render::summary_text(abridge::render::SummaryView {
            up_to_turn_index: c.up_to_turn_index,
            summary: newest.summary.as_deref().unwrap(),
        })
    );
    let idx: Vec<i64> = view.turns.iter().map(|t| t.idx).collect();
    assert_eq!(idx, ((c.up_to_turn_index + 1)..8).collect::<Vec<_>>());
}
