//! A real tokenizer as the token counter (feature `tiktoken`).

use super::TokenCounter;
use crate::error::{Error, Result};

/// Counts tokens with one of tiktoken's BPE encodings (the tables are built
/// into the binary: no download). Exact for OpenAI's models; for other
/// providers' models a closer estimate than characters / 4, and like every
/// counter used only where the provider reports no input tokens.
///
/// Counting needs the text: a step's estimate renders its messages as text
/// once (the default counter needs only their length).
#[derive(Clone, Copy)]
pub struct TiktokenCounter {
    bpe: &'static tiktoken_rs::CoreBPE,
    encoding: &'static str,
}

impl std::fmt::Debug for TiktokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TiktokenCounter({})", self.encoding)
    }
}

impl TiktokenCounter {
    /// `o200k_base`: GPT-4o, GPT-4.1, GPT-5, o-series.
    pub fn o200k_base() -> TiktokenCounter {
        TiktokenCounter {
            bpe: tiktoken_rs::o200k_base_singleton(),
            encoding: "o200k_base",
        }
    }

    /// `cl100k_base`: GPT-4, GPT-3.5.
    pub fn cl100k_base() -> TiktokenCounter {
        TiktokenCounter {
            bpe: tiktoken_rs::cl100k_base_singleton(),
            encoding: "cl100k_base",
        }
    }

    /// The encoding of an OpenAI model id; [`Error::Config`] for a model
    /// tiktoken does not know.
    pub fn for_model(model: &str) -> Result<TiktokenCounter> {
        use tiktoken_rs::tokenizer::Tokenizer;
        match tiktoken_rs::tokenizer::get_tokenizer(model) {
            Some(Tokenizer::O200kBase) => Ok(TiktokenCounter::o200k_base()),
            Some(Tokenizer::Cl100kBase) => Ok(TiktokenCounter::cl100k_base()),
            _ => Err(Error::Config(format!(
                "no tiktoken encoding is known for model {model:?}"
            ))),
        }
    }

    /// The encoding's name.
    pub fn encoding(&self) -> &'static str {
        self.encoding
    }
}

impl TokenCounter for TiktokenCounter {
    fn count(&self, text: &str) -> u64 {
        self.bpe.encode_ordinary(text).len() as u64
    }
}
