//! The MCP fixture server answers the protocol's handshake and lists its
//! tools over stdio (and, being an integration test of this package, makes
//! `cargo test` build the `abridge-mcp-fixture` binary the command's MCP
//! tests run).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

#[test]
fn the_fixture_answers_initialize_and_lists_its_tools_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_abridge-mcp-fixture"))
        .args(["--log", &dir.path().join("log").display().to_string()])
        .args(["--state", &dir.path().join("state").display().to_string()])
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |msg: serde_json::Value| {
        writeln!(stdin, "{msg}").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let init = ask(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    let list = ask(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    assert_eq!(list["result"]["tools"].as_array().unwrap().len(), 7);
    let _ = child.kill();
    let _ = child.wait();
}
