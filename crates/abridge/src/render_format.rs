//! Which rendering of stored rows a step's hash was computed with: a word the
//! store's tables record and the renderer reads, so it sits below both.

use crate::error::Result;

/// How stored rows are rendered into message bytes. Each executed step records
/// the format its hash was computed with (`steps.render_format`), and a rebuild
/// uses that one, so a change here never changes the bytes of an older step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenderFormat {
    /// Schema version 1: stored responses were parsed with serde_json's default
    /// float parser, which can be one unit in the last place off
    /// (`1.0715660391465826e-75` read as `...825e-75`).
    V1,
    /// Schema version 2 on: every JSON number is parsed exactly, so it renders
    /// as the text that was stored.
    V2,
}

impl RenderFormat {
    /// The format this build renders new steps with.
    pub const CURRENT: RenderFormat = RenderFormat::V2;

    /// The value stored in `steps.render_format`.
    pub fn as_i64(self) -> i64 {
        match self {
            RenderFormat::V1 => 1,
            RenderFormat::V2 => 2,
        }
    }

    /// The format stored as `v`. Errors on a format this build does not know
    /// (a store written by a newer version that slipped past the schema check).
    pub fn from_i64(v: i64) -> Result<RenderFormat> {
        match v {
            1 => Ok(RenderFormat::V1),
            2 => Ok(RenderFormat::V2),
            other => Err(crate::error::Error::Config(format!(
                "unknown render format {other}"
            ))),
        }
    }
}
