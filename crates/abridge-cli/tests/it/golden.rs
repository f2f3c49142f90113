//! G3 across versions: stores written by earlier builds rebuild byte for byte.
//!
//! `crates/abridge-cli/tests/fixtures/golden-v*.db` are small stores written by the build whose
//! schema version the name carries (several sessions, compactions, tools in all
//! three effect modes, Unicode, floats that serde_json's default parser does not
//! round-trip, a failed turn). Every later build opens a copy (migrating it to
//! the current schema), rebuilds every executed step to the hash it recorded
//! when it ran, and passes `verify`. A change to the byte format therefore
//! needs a schema version and a renderer that still rebuilds the old steps.
//!
//! To write the fixture of the current schema version (only when the version
//! changes): `ABRIDGE_GOLDEN_OUT=$PWD/crates/abridge-cli/tests/fixtures/golden-vN.db cargo test --test
//! it -- --ignored golden::write_golden_store`.

use abridge::{
    CompactionConfig, ModelClient, ModelError, ModelRequest, ModelResponse, ResponseBlock, Runner,
    RunnerConfig, Store, Threshold, Tool, ToolCall, ToolError, ToolSpec, Tools, TransactionalTool,
    Usage,
};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

const MODEL: &str = "golden-model";

/// Replies from the turn's input: step 0 calls one tool of each effect mode
/// (with floats and Unicode in the arguments), step 1 answers. An input with
/// "FAIL" gets a permanent model error (a failed turn).
struct GoldenModel;

#[abridge::async_trait]
impl ModelClient for GoldenModel {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().expect("a message");
        let text: String = serde_json::to_string(&last.content).unwrap();
        if text.contains("FAIL") {
            return Err(ModelError::Permanent("the model refused: FAIL".into()));
        }
        let is_tool_result = text.contains("tool_result");
        let n = req.messages.len() as f64;
        // From schema 5: a turn of several tool steps whose fourth step is
        // refused as too long until older results are left out (after the
        // earlier turns were compacted for it).
        let input = req
            .messages
            .iter()
            .rev()
            .find(|m| {
                matches!(m.content.first(), Some(abridge::ContentBlock::Text { .. }))
                    && m.role == abridge::Role::User
            })
            .map(|m| serde_json::to_string(&m.content).unwrap())
            .unwrap_or_default();
        if input.contains("MANY") {
            let steps = req
                .messages
                .iter()
                .rev()
                .take_while(|m| {
                    !(m.role == abridge::Role::User
                        && matches!(m.content.first(), Some(abridge::ContentBlock::Text { .. })))
                })
                .filter(|m| m.role == abridge::Role::Assistant)
                .count();
            let all = serde_json::to_string(&*req.messages).unwrap();
            if steps < 3 {
                return Ok(ModelResponse {
                    blocks: vec![ResponseBlock::ToolUse {
                        id: format!("m{steps}"),
                        name: "lookup".into(),
                        input: json!({"step": steps}),
                        raw_input: Some(format!("{{ \"step\" :{steps} }}")),
                    }],
                    stop_reason: Some("tool_use".into()),
                    model: None,
                    ..Default::default()
                });
            }
            if !all.contains("left out to fit the context window") {
                return Err(ModelError::ContextOverflow("prompt is too long".into()));
            }
            return Ok(ModelResponse {
                blocks: vec![ResponseBlock::Text {
                    text: "many done".into(),
                }],
                ..Default::default()
            });
        }
        if !is_tool_result {
            let blocks = vec![
                ResponseBlock::Thinking {
                    thinking: "The user wants an order — look it up. 考える".into(),
                    signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDx==".into()),
                },
                ResponseBlock::RedactedThinking {
                    data: "EmwKAhgBEgy3va3pzix/LafPsn4aDF==".into(),
                },
                ResponseBlock::Text {
                    text: "Je regarde ça — 一下 🚚 नमस्ते".into(),
                },
                ResponseBlock::ToolUse {
                    id: "c1".into(),
                    name: "note".into(),
                    input: json!({"text": "naïve café ﷽ 👩‍👩‍👧", "weight": 1.0715660391465826e-75, "w2": -1.81996730402717e-179}),
                    raw_input: None,
                },
                ResponseBlock::ToolUse {
                    id: "c2".into(),
                    name: "lookup".into(),
                    input: json!({"amount": 0.1 + 0.2, "n": n, "big": 1.7976931348623157e308}),
                    raw_input: Some(format!(
                        "{{\"n\":{n},  \"amount\": 0.30000000000000004, \"big\": 1.7976931348623157e308}}"
                    )),
                },
                ResponseBlock::ToolUse {
                    id: "c3".into(),
                    name: "send".into(),
                    input: json!({"to": "ana@example.org", "ratio": 2.0f64.sqrt() / 3.0}),
                    raw_input: None,
                },
            ];
            return Ok(ModelResponse {
                blocks,
                usage: Usage {
                    input_tokens: None,
                    output_tokens: Some(40),
                    ..Default::default()
                },
                stop_reason: Some("tool_use".into()),
                model: None,
            });
        }
        Ok(ModelResponse {
            blocks: vec![ResponseBlock::Text {
                text: format!(
                    "Done: {} messages. Ελληνικά, עברית, 🇫🇷.",
                    req.messages.len()
                ),
            }],
            usage: Usage {
                input_tokens: Some(n as u64 * 50),
                output_tokens: Some(12),
                cache_read_tokens: Some(n as u64 * 40),
                cache_write_tokens: Some(n as u64 * 5),
            },
            stop_reason: Some("end_turn".into()),
            model: None,
        })
    }
}

struct Note;
impl TransactionalTool for Note {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<Value, ToolError> {
        tx.execute(
            "INSERT INTO golden_notes (key, body) VALUES (?1, ?2)",
            (&call.idempotency_key, call.input.to_string()),
        )
        .map_err(|e| ToolError::new(e.to_string()))?;
        Ok(json!({"saved": true, "x": -1.603964615428183e+143}))
    }
}

struct Lookup;
#[abridge::async_trait]
impl Tool for Lookup {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        Ok(json!({"echo": call.input, "status": "✓ shipped"}))
    }
}

struct Send;
#[abridge::async_trait]
impl Tool for Send {
    async fn call(&self, _: &ToolCall) -> Result<Value, ToolError> {
        Ok(Value::String("sent 📨".into()))
    }
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema: json!({"type": "object"}),
    }
}

#[test]
#[ignore = "writes a fixture; run by hand when the schema version changes"]
fn write_golden_store() {
    let out = PathBuf::from(std::env::var("ABRIDGE_GOLDEN_OUT").expect("ABRIDGE_GOLDEN_OUT"));
    assert!(!out.exists(), "{} exists", out.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Store::open(&out).unwrap();
        store
            .with_conn(|c| {
                c.execute_batch("CREATE TABLE golden_notes (key TEXT PRIMARY KEY, body TEXT)")?;
                Ok(())
            })
            .unwrap();
        let tools = Tools::new()
            .transactional(spec("note"), Note)
            .idempotent(spec("lookup"), Lookup)
            .at_most_once(spec("send"), Send);
        let mut cfg = RunnerConfig::default().with_owner("golden");
        cfg.compaction = CompactionConfig::default()
            .with_compact_at(Threshold::Tokens(900))
            .with_keep_last_turns(1);
        let runner = Runner::builder(store.clone(), Arc::new(GoldenModel))
            .tools(tools)
            .config(cfg)
            .build()
            .unwrap();
        for s in 0..3 {
            let prompt = format!("System {s}: réponds en français — 日本語も OK.");
            let session = runner
                .create_session(&format!("golden-{s} ✓"), MODEL, &prompt)
                .await
                .unwrap();
            for t in 0..8 {
                let input = if s == 1 && t == 5 {
                    "please FAIL this turn".to_string()
                } else if s == 2 && t == 4 {
                    "MANY lookups, please".to_string()
                } else {
                    format!("Turn {t}: where is order ORD-{}{t}? Ünïcödé ☃ 𝄞", 1000 + s)
                };
                let r = runner.run_turn(session.id, &input).await;
                assert_eq!(r.is_err(), input.contains("FAIL"), "{r:?}");
            }
        }
        // From schema 6: a session run and deleted (the erasure record,
        // the id floors).
        let gone = runner
            .create_session("golden-deleted", MODEL, "deleted")
            .await
            .unwrap();
        runner
            .run_turn(gone.id, "Turn 0: a secret to forget")
            .await
            .unwrap();
        store.delete_session(gone.id).await.unwrap();
        // From schema 7: a redaction (the steps it changed rebuild, with the
        // marker, to the hashes it recorded).
        let redacted = store
            .redact(
                "golden-0 ✓",
                abridge::admin::Pattern::text("ORD-10003").unwrap(),
            )
            .await
            .unwrap();
        assert!(redacted.steps_rebuilt > 0);
        // From schema 9: calls that waited for a decision: one approved with
        // edited arguments and run, one rejected, and a turn left parked.
        let asking = Runner::builder(store.clone(), Arc::new(GoldenModel))
            .tools(
                Tools::new()
                    .transactional(spec("note"), Note)
                    .idempotent(spec("lookup"), Lookup)
                    .at_most_once(spec("send"), Send),
            )
            .config(RunnerConfig::default().with_owner("golden"))
            .approval(abridge::Approval::all())
            .build()
            .unwrap();
        let s2 = store.session("golden-2 ✓").await.unwrap();
        for (t, decide) in [(8, true), (9, false), (10, true)] {
            let input = format!("Turn {t}: where is order ORD-1002{t}? ⏳");
            let parked = asking.run_turn_at(s2.id, t, &input).await.unwrap();
            assert!(parked.is_parked(), "turn {t} did not park");
            if t == 10 {
                break; // left parked
            }
            for call in &parked.pending {
                let d = match decide {
                    true => {
                        let mut edited: serde_json::Value =
                            serde_json::from_str(&call.arguments).unwrap();
                        edited["edited"] = serde_json::json!(true);
                        abridge::Decision::Approve {
                            input: Some(edited),
                            always: false,
                        }
                    }
                    false => abridge::Decision::reject("not now ✋"),
                };
                asking.decide(call.id, d, Some("golden")).await.unwrap();
            }
            let done = asking.run_turn_at(s2.id, t, &input).await.unwrap();
            assert!(!done.is_parked());
        }
        // From schema 12: a verified point (where `verify --incremental`
        // left off).
        store
            .with_conn(|c| {
                let report = abridge::verify::verify(c)?;
                abridge::verify::record_point(c, &report)?;
                Ok(())
            })
            .unwrap();
        // A file's rows all in the main file (a server's are its own).
        if !abridge::store::is_url(&out.to_string_lossy()) {
            store
                .with_conn(|c| {
                    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
                    Ok(())
                })
                .unwrap();
        }
    });
}

fn fixtures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (the golden stores are tracked in git)",
                dir.display()
            )
        })
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("golden-v") && n.ends_with(".db"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_step_of_every_golden_store_rebuilds_to_its_recorded_hash() {
    let found = fixtures();
    assert!(
        found
            .iter()
            .any(|p| p.ends_with(format!("golden-v{}.db", abridge::store::SCHEMA_VERSION))),
        "no golden store of the current schema version in {found:?}"
    );
    for fixture in found {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("golden.db");
        std::fs::copy(&fixture, &path).unwrap();
        let store = Store::open(&path).unwrap();
        let (steps, kinds) = store
            .with_conn(|c| {
                let ids = abridge::inspect::executed_step_ids(c)?;
                for id in &ids {
                    let r = abridge::replay::rebuild_step(c, *id)?;
                    assert!(
                        r.holds(),
                        "{}: step {id} rebuilt {} but recorded {}",
                        fixture.display(),
                        r.sha256,
                        r.recorded
                    );
                }
                let kinds: (i64, i64, i64, i64) = c.query_row(
                    "SELECT (SELECT count(DISTINCT effect) FROM tool_invocations \
                             WHERE effect IN ('transactional','idempotent','at_most_once')), \
                            (SELECT count(*) FROM compactions WHERE status = 'completed'), \
                            (SELECT count(*) FROM turns WHERE status = 'failed'), \
                            (SELECT count(*) FROM sessions)",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )?;
                Ok((ids.len(), kinds))
            })
            .unwrap();
        let (modes, compactions, failed, sessions) = kinds;
        assert!(steps >= 40, "{}: {steps} steps", fixture.display());
        assert_eq!(
            (modes, failed, sessions),
            (3, 1, 3),
            "{}",
            fixture.display()
        );
        assert!(
            compactions >= 3,
            "{}: {compactions} compactions",
            fixture.display()
        );
        let report = store.with_conn(|c| abridge::verify::verify(c)).unwrap();
        assert!(report.ok, "{}: {report:#?}", fixture.display());
    }
}

/// A store written before pins existed gets the facts of its finished turns
/// pinned when it is opened (migrated); its old compactions are not held to
/// G8 (they completed without the guard) and `verify` passes.
#[test]
fn a_store_from_before_pins_gets_its_facts_pinned_when_migrated() {
    let v2 = fixtures()
        .into_iter()
        .find(|p| p.ends_with("golden-v2.db"))
        .expect("golden-v2.db");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("golden.db");
    std::fs::copy(&v2, &path).unwrap();
    let store = Store::open(&path).unwrap();
    let (pins, unguarded, version) = store
        .with_conn(|c| {
            Ok((
                c.query_row("SELECT count(*) FROM pins", [], |r| r.get::<_, i64>(0))?,
                c.query_row(
                    "SELECT count(*) FROM compactions WHERE pins_live IS NULL",
                    [],
                    |r| r.get::<_, i64>(0),
                )?,
                c.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))?,
            ))
        })
        .unwrap();
    assert_eq!(version, abridge::store::SCHEMA_VERSION);
    assert!(pins > 0, "no facts pinned from the old turns");
    assert!(unguarded > 0);
    let sessions = store.with_conn(|c| abridge::inspect::sessions(c)).unwrap();
    let first = sessions[0].session.id;
    let live = store
        .with_conn(move |c| {
            abridge::inspect::live_pins(c, first, i64::MAX, abridge::pins::DEFAULT_PINS_WINDOW)
        })
        .unwrap();
    assert!(
        live.iter().any(|p| p.value.starts_with("ORD-100")),
        "{live:#?}"
    );
    let report = store.with_conn(|c| abridge::verify::verify(c)).unwrap();
    assert!(report.ok, "{report:#?}");
}
