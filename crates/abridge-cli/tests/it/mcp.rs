//! Tools from MCP servers, against real servers: the project's own
//! (`abridge-mcp-fixture`, over stdio and streamable HTTP, built with the
//! test kit) and the reference "everything" server from npm (installed by
//! `.ci/run`; its path in `ABRIDGE_TEST_MCP_EVERYTHING`). Listing and
//! registering, results, the idempotency key in `_meta`, a server killed
//! mid-call, and a crash of the host between the call and its result's
//! commit: the mode decides.

use crate::common;
use abridge::mcp::{McpEffects, McpServer, McpTransport, IDEMPOTENCY_KEY_META};
use abridge::message::{ContentBlock, ModelRequest, ModelResponse, ResponseBlock, Role, Usage};
use abridge::store::Effect;
use abridge::{Error, ModelClient, ModelError, Runner, RunnerConfig, Store, Tools};
use abridge_testkit::mcp_fixture;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The fixture server's binary (built by `cargo test` with the test kit).
pub fn fixture_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_abridge")).with_file_name("abridge-mcp-fixture");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p abridge-testkit --bin abridge-mcp-fixture` \
         (`cargo test` at the workspace root does)",
        bin.display()
    );
    bin
}

/// A fixture's files: its call log and its state directory.
pub struct Files {
    _dir: tempfile::TempDir,
    pub log: PathBuf,
    pub state: PathBuf,
}

impl Files {
    pub fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        Files {
            log: dir.path().join("calls.jsonl"),
            state: dir.path().join("state"),
            _dir: dir,
        }
    }

    pub fn args(&self) -> Vec<String> {
        vec![
            "--log".into(),
            self.log.display().to_string(),
            "--state".into(),
            self.state.display().to_string(),
        ]
    }

    pub fn stdio(&self) -> McpTransport {
        let mut args = self.args();
        args.push("--stdio".into());
        McpTransport::Stdio {
            program: fixture_bin().display().to_string(),
            args,
            env: vec![],
        }
    }

    pub fn calls(&self) -> Vec<Value> {
        mcp_fixture::calls(&self.log)
    }

    fn calls_of(&self, tool: &str) -> Vec<Value> {
        self.calls()
            .into_iter()
            .filter(|c| c["tool"] == tool)
            .collect()
    }

    fn state_lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.state.join(file))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// The fixture over streamable HTTP, as a process.
pub struct HttpFixture {
    child: std::process::Child,
    pub url: String,
}

impl HttpFixture {
    pub fn start(files: &Files, addr: &str) -> HttpFixture {
        use std::io::BufRead;
        let mut child = std::process::Command::new(fixture_bin())
            .args(files.args())
            .args(["--http", addr])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the fixture said {line:?}"))
            .to_string();
        HttpFixture { child, url }
    }

    fn addr(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_string()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The model: "call TOOL {json}" calls TOOL once with the JSON; a tool's
/// result is answered "ok: RESULT" or "error: RESULT".
struct Caller;

#[abridge::async_trait]
impl ModelClient for Caller {
    async fn complete(&self, req: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let last = req.messages.last().unwrap();
        let answer = |blocks| ModelResponse {
            blocks,
            usage: Usage::new(Some(50), Some(5)),
            stop_reason: None,
            model: None,
        };
        for b in &last.content {
            match b {
                ContentBlock::ToolResult {
                    content, is_error, ..
                } if last.role == Role::User => {
                    let word = if *is_error { "error" } else { "ok" };
                    return Ok(answer(vec![ResponseBlock::Text {
                        text: format!("{word}: {content}"),
                    }]));
                }
                ContentBlock::Text { text } => {
                    let rest = text.strip_prefix("call ").unwrap_or_default();
                    let (tool, input) = rest.split_once(' ').unwrap_or((rest, "{}"));
                    return Ok(answer(vec![ResponseBlock::ToolUse {
                        id: "call_1".into(),
                        name: tool.into(),
                        input: serde_json::from_str(input).unwrap(),
                        raw_input: None,
                    }]));
                }
                _ => {}
            }
        }
        Err(ModelError::Permanent("nothing to answer".into()))
    }
}

fn runner(store: &Store, tools: Tools, hook: Option<abridge::FaultHook>) -> Runner {
    let mut cfg = RunnerConfig::default().with_owner("mcp-test");
    cfg.testing.fault_hook = hook;
    Runner::builder(store.clone(), Arc::new(Caller))
        .tools(tools)
        .config(cfg)
        .build()
        .unwrap()
}

/// A session on a new store whose runner has `server`'s tools with `effects`.
struct Chat {
    _dir: tempfile::TempDir,
    store: Store,
    runner: Runner,
    session: abridge::SessionId,
}

impl Chat {
    async fn new(server: &McpServer, effects: &McpEffects) -> Chat {
        let tools = server.register(Tools::new(), effects).unwrap();
        let (dir, path) = common::temp_db();
        let store = common::store_at(&path);
        let runner = runner(&store, tools, None);
        let session = runner
            .create_session("m", "gpt-4o-mini", "sys")
            .await
            .unwrap()
            .id;
        Chat {
            _dir: dir,
            store,
            runner,
            session,
        }
    }

    /// One turn's answer.
    async fn say(&self, input: &str) -> String {
        self.runner
            .run_turn(self.session, input)
            .await
            .unwrap()
            .output
    }
}

/// The invocation rows: (tool, effect, status, result, idempotency key).
fn invocations(store: &Store) -> Vec<(String, String, String, String, String)> {
    store
        .with_conn(|c| {
            let mut st = c.prepare(
                "SELECT tool_name, effect, status, coalesce(result, ''), idempotency_key \
                 FROM tool_invocations ORDER BY id",
            )?;
            let mut rows = st.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?));
            }
            Ok(out)
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_tools_are_registered_with_their_schemas_and_the_hosts_modes() {
    let files = Files::new();
    let server = McpServer::connect(files.stdio()).await.unwrap();
    let listed = mcp_fixture::Fixture::tools();
    assert_eq!(server.tools().len(), listed.as_array().unwrap().len());
    for (tool, want) in server.tools().iter().zip(listed.as_array().unwrap()) {
        assert_eq!(tool.name, want["name"]);
        assert_eq!(tool.description, want["description"]);
        assert_eq!(tool.input_schema, want["inputSchema"]);
    }
    // By default every tool is at-most-once; trusting the annotations, the
    // read-only and idempotent ones are idempotent; the host's word wins.
    let effects = McpEffects::new()
        .trust_annotations()
        .tool("die_once", Effect::AtMostOnce);
    let modes: Vec<(String, Effect)> = server
        .tools()
        .iter()
        .map(|t| (t.name.clone(), effects.effect_of(t)))
        .collect();
    let want = [
        ("echo", Effect::Idempotent),
        ("add_note", Effect::Idempotent),
        ("send_email", Effect::AtMostOnce),
        ("weather", Effect::Idempotent),
        ("fail", Effect::AtMostOnce),
        ("slow", Effect::AtMostOnce),
        ("die_once", Effect::AtMostOnce),
    ];
    assert_eq!(
        modes,
        want.iter()
            .map(|(n, e)| (n.to_string(), *e))
            .collect::<Vec<_>>()
    );
    assert!(server
        .tools()
        .iter()
        .all(|t| McpEffects::new().effect_of(t) == Effect::AtMostOnce));
    let tools = server.register(Tools::new(), &effects).unwrap();
    let specs = tools.specs();
    assert_eq!(specs.len(), 7);
    // A second server with the same tools needs a prefix.
    let again = McpServer::connect(files.stdio()).await.unwrap();
    assert!(matches!(
        again.register(tools.clone(), &McpEffects::new()),
        Err(abridge::mcp::McpError::DuplicateTool { .. })
    ));
    let both = again
        .register(tools, &McpEffects::new().prefix("b_"))
        .unwrap();
    assert!(both.specs().iter().any(|s| s.name == "b_echo"));
    // A mode for a tool the server lacks is refused.
    assert!(server
        .register(
            Tools::new(),
            &McpEffects::new().tool("nope", Effect::Idempotent)
        )
        .is_err());
    // A command that is not there is a typed error.
    let missing = McpServer::command_line("/nonexistent/mcp-server --stdio").await;
    assert!(matches!(
        missing,
        Err(abridge::mcp::McpError::Connect { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_results_are_stored_as_their_exact_text_and_calls_carry_the_idempotency_key() {
    let files = Files::new();
    let server = McpServer::connect(files.stdio()).await.unwrap();
    let chat = Chat::new(&server, &McpEffects::new().trust_annotations()).await;
    assert_eq!(
        chat.say(r#"call echo {"text":"héllo\nworld"}"#).await,
        "ok: héllo\nworld"
    );
    assert_eq!(
        chat.say(r#"call weather {"city":"Oslo"}"#).await,
        r#"ok: {"city":"Oslo","sky":"clear"}"#
    );
    assert_eq!(
        chat.say("call fail {}").await,
        "error: the fixture always fails"
    );
    assert!(chat.say("call nope {}").await.starts_with("error: "));
    let store = &chat.store;
    let rows = invocations(store);
    assert_eq!(rows[0].0, "echo");
    assert_eq!(rows[0].1, "idempotent");
    assert_eq!(rows[0].3, "héllo\nworld");
    assert_eq!(rows[1].3, r#"{"city":"Oslo","sky":"clear"}"#);
    assert_eq!(
        (rows[2].1.as_str(), rows[2].2.as_str()),
        ("at_most_once", "failed")
    );
    assert_eq!(rows[2].3, "the fixture always fails");
    // Each call's _meta carried its invocation's key.
    let calls = files.calls();
    assert_eq!(calls.len(), 3);
    for (call, row) in calls.iter().zip(&rows) {
        assert_eq!(call["tool"], row.0.as_str());
        assert_eq!(call["key"], row.4.as_str(), "{IDEMPOTENCY_KEY_META}");
    }
    common::assert_verified(store);
    assert!(common::assert_all_steps_rebuild(store) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_is_connected_again_and_the_mode_decides() {
    // Idempotent: the call is sent again, with its key, to a new process.
    let files = Files::new();
    let server = McpServer::connect(files.stdio()).await.unwrap();
    let chat = Chat::new(&server, &McpEffects::new().trust_annotations()).await;
    assert_eq!(chat.say("call die_once {}").await, "ok: survived");
    let calls = files.calls_of("die_once");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0]["key"], calls[1]["key"]);
    assert_ne!(calls[0]["pid"], calls[1]["pid"]);
    assert_eq!(server.reconnects(), 1);

    // At-most-once: not sent again; the outcome is unknown, and the next
    // call goes to a new process.
    let files = Files::new();
    let server = McpServer::connect(files.stdio()).await.unwrap();
    let effects = McpEffects::new().tool("die_once", Effect::AtMostOnce);
    let chat = Chat::new(&server, &effects).await;
    let said = chat.say("call die_once {}").await;
    assert!(said.starts_with("error: "), "{said}");
    assert!(said.contains("outcome is unknown"), "{said}");
    assert_eq!(files.calls_of("die_once").len(), 1);
    assert_eq!(
        chat.say(r#"call echo {"text":"still here"}"#).await,
        "ok: still here"
    );
    assert_eq!(server.reconnects(), 1);
    common::assert_verified(&chat.store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_streamable_http_a_restarted_server_is_connected_again() {
    let files = Files::new();
    let mut http = HttpFixture::start(&files, "127.0.0.1:0");
    let server = McpServer::http(&http.url, [("x-fixture", "yes")])
        .await
        .unwrap();
    assert_eq!(server.tools().len(), 7);
    let chat = Chat::new(&server, &McpEffects::new().trust_annotations()).await;
    assert_eq!(
        chat.say(r#"call add_note {"note":"one"}"#).await,
        "ok: noted: one"
    );

    // Killed mid-call: an at-most-once call's outcome is unknown.
    let addr = http.addr();
    let turn = {
        let (r, s) = (chat.runner.clone(), chat.session);
        tokio::spawn(async move { r.run_turn(s, r#"call slow {"ms":5000}"#).await })
    };
    for _ in 0..200 {
        if !files.calls_of("slow").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    http.kill();
    let o = turn.await.unwrap().unwrap();
    assert!(o.output.contains("outcome is unknown"), "{}", o.output);
    assert_eq!(files.calls_of("slow").len(), 1);

    // Restarted on the same address: the next call reaches it.
    let _again = HttpFixture::start(&files, &addr);
    assert_eq!(
        chat.say(r#"call add_note {"note":"two"}"#).await,
        "ok: noted: two"
    );
    assert_eq!(files.state_lines("notes"), ["one", "two"]);
    common::assert_verified(&chat.store);
}

/// Runs one turn that calls `tool`, crashing once at `AfterToolEffect` (the
/// tool ran, its result is not committed) and resuming with a fresh runner,
/// as a restarted host would.
async fn crash_after_the_call(files: &Files, effects: &McpEffects, input: &str) -> (Store, String) {
    let (dir, path) = common::temp_db();
    std::mem::forget(dir);
    let store = common::store_at(&path);
    let server = McpServer::connect(files.stdio()).await.unwrap();
    let tools = server.register(Tools::new(), effects).unwrap();
    let first = runner(
        &store,
        tools.clone(),
        Some(common::fail_at(abridge::FaultPoint::AfterToolEffect, 1)),
    );
    let s = first
        .create_session("m", "gpt-4o-mini", "sys")
        .await
        .unwrap();
    match first.run_turn_at(s.id, 0, input).await {
        Err(Error::Injected(_)) => {}
        other => panic!("no crash: {other:?}"),
    }
    // The restarted host connects anew.
    let server = McpServer::connect(files.stdio()).await.unwrap();
    let tools = server.register(Tools::new(), effects).unwrap();
    let out = runner(&store, tools, None)
        .run_turn_at(s.id, 0, input)
        .await
        .unwrap();
    (store, out.output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_an_mcp_call_and_its_commit_is_decided_by_the_mode() {
    // At-most-once: not called again; the model is told the outcome is unknown.
    let files = Files::new();
    let (store, output) = crash_after_the_call(
        &files,
        &McpEffects::new(),
        r#"call send_email {"to":"ann@example.com","body":"hi"}"#,
    )
    .await;
    assert_eq!(files.calls_of("send_email").len(), 1);
    assert_eq!(files.state_lines("outbox"), ["ann@example.com"]);
    assert!(output.starts_with("error: "), "{output}");
    assert!(output.to_lowercase().contains("unknown"), "{output}");
    common::assert_verified(&store);

    // Idempotent: called again with the same key, which the server
    // recognises: the note is added once.
    let files = Files::new();
    let (store, output) = crash_after_the_call(
        &files,
        &McpEffects::new().tool("add_note", Effect::Idempotent),
        r#"call add_note {"note":"buy milk"}"#,
    )
    .await;
    assert_eq!(output, "ok: noted: buy milk");
    let calls = files.calls_of("add_note");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["key"], calls[1]["key"]);
    assert_eq!(
        (calls[0]["applied"].clone(), calls[1]["applied"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(files.state_lines("notes"), ["buy milk"]);
    common::assert_verified(&store);
    assert!(common::assert_all_steps_rebuild(&store) > 0);
}

/// The reference "everything" server (npm `@modelcontextprotocol/server-everything`),
/// when `.ci/run` installed it: `ABRIDGE_TEST_MCP_EVERYTHING` is its
/// `mcp-server-everything` executable. Required under `ABRIDGE_REQUIRE_MCP`.
fn everything() -> Option<String> {
    match std::env::var("ABRIDGE_TEST_MCP_EVERYTHING") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            assert!(
                std::env::var_os("ABRIDGE_REQUIRE_MCP").is_none(),
                "ABRIDGE_REQUIRE_MCP is set and ABRIDGE_TEST_MCP_EVERYTHING is not"
            );
            eprintln!("skipped: ABRIDGE_TEST_MCP_EVERYTHING is not set");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_everything_server_over_stdio_is_a_runners_tools() {
    let Some(bin) = everything() else { return };
    let server = McpServer::connect(McpTransport::Stdio {
        program: bin,
        args: vec!["stdio".into()],
        env: vec![],
    })
    .await
    .unwrap();
    let names: Vec<&str> = server.tools().iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"echo"), "{names:?}");
    let chat = Chat::new(&server, &McpEffects::new().trust_annotations()).await;
    assert_eq!(
        chat.say(r#"call echo {"message":"from abridge"}"#).await,
        "ok: Echo: from abridge"
    );
    let rows = invocations(&chat.store);
    assert_eq!(rows[0].3, "Echo: from abridge");
    common::assert_verified(&chat.store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_everything_server_over_streamable_http_is_a_runners_tools() {
    use std::io::BufRead;
    let Some(bin) = everything() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Ended however the test ends.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Server(
        std::process::Command::new(&bin)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the server ended");
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let url = format!("http://127.0.0.1:{port}/mcp");
    let server = McpServer::http(&url, Vec::<(String, String)>::new())
        .await
        .unwrap();
    let chat = Chat::new(&server, &McpEffects::new()).await;
    assert_eq!(
        chat.say(r#"call echo {"message":"over http"}"#).await,
        "ok: Echo: over http"
    );
    assert_eq!(invocations(&chat.store)[0].1, "at_most_once");
}
