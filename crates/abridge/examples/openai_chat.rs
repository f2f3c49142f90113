//! A durable session against the provider behind `abridge::providers::OpenAiChat`,
//! its answers streamed (see `provider_host`): the real API when its key is
//! set, a local stand-in otherwise.
//!
//! `cargo run -p abridge-engine --features providers --example openai_chat`

#[path = "provider_host/mod.rs"]
mod provider_host;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    provider_host::main_for(abridge_testkit::local_provider::Wire::OpenAiChat).await
}
