//! A durable session against the provider behind `abridge::providers::Anthropic`,
//! its answers streamed (see `provider_host`): the real API when its key is
//! set, a local stand-in otherwise.
//!
//! `cargo run -p abridge-engine --features providers --example anthropic`

#[path = "provider_host/mod.rs"]
mod provider_host;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    provider_host::main_for(abridge_testkit::local_provider::Wire::Anthropic).await
}
