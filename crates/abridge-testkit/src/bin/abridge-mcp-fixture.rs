//! The MCP tests' own server (`abridge_testkit::mcp_fixture`):
//! `abridge-mcp-fixture --log FILE --state DIR (--stdio | --http ADDR)`.

use abridge_testkit::mcp_fixture::Fixture;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(log), Some(state)) = (value("--log"), value("--state")) else {
        eprintln!("usage: abridge-mcp-fixture --log FILE --state DIR (--stdio | --http ADDR)");
        std::process::exit(2);
    };
    let fixture = Fixture::new(log.into(), state.into());
    match value("--http") {
        Some(addr) => {
            if let Err(e) = fixture.serve_http(&addr).await {
                eprintln!("abridge-mcp-fixture: {e}");
                std::process::exit(1);
            }
        }
        None => fixture.serve_stdio().await,
    }
}
