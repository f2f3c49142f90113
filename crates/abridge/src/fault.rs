//! Named fault points and the hook that reaches them.
//!
//! The runner and the compactor call the configured [`FaultHook`] at each point
//! below. A hook that returns an error makes the runner stop right there, as a
//! crash would: nothing is rolled back beyond the open transaction, nothing is
//! marked failed. Tests use it to inject a failure at an exact point; the chaos
//! harness uses it to kill its own process there. Without a hook the cost is one
//! branch per point.

use std::fmt;
use std::sync::Arc;

/// A place in the step or compaction protocol where a crash can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FaultPoint {
    /// The step row is claimed (by the transaction that began the turn or
    /// completed the previous step) and its messages built; the model has not
    /// been called.
    BeforeModelCall,
    /// The model's response is written in the step's transaction; no tool has
    /// run, nothing of the step is committed (a crash here calls the model again).
    AfterResponseWritten,
    /// Between two tool invocations of one step (inside the step's transaction
    /// unless the first was an async tool, whose result opens a new one).
    BetweenTools,
    /// Inside a transactional tool's transaction, after its writes, before commit.
    InsideTransactionalTool,
    /// An idempotent or at-most-once tool ran; its result is not yet recorded.
    AfterToolEffect,
    /// Every tool result of the step is written, in the step's last transaction;
    /// the step's completion and the next step's claim are not: a crash here
    /// rolls back everything since the step's previous commit.
    BeforeStepComplete,
    /// A compaction row is claimed (pending); the summariser has not been called.
    AfterClaim,
    /// The summariser was called at least once; the summary is not persisted.
    MidSummary,
    /// The compaction is completed; the step has not read it yet.
    AfterCompactionComplete,
    /// A delegating call's child session is created (committed); its turn
    /// has not begun. Reached only by a delegate tool ([`FaultPoint::DELEGATION`]).
    ChildCreated,
    /// A delegating call's child has answered (its turn completed); the
    /// parent's tool result is not yet recorded.
    ChildAnswered,
}

impl FaultPoint {
    /// Every point, in protocol order.
    pub const ALL: [FaultPoint; 9] = [
        FaultPoint::AfterClaim,
        FaultPoint::MidSummary,
        FaultPoint::AfterCompactionComplete,
        FaultPoint::BeforeModelCall,
        FaultPoint::AfterResponseWritten,
        FaultPoint::BetweenTools,
        FaultPoint::InsideTransactionalTool,
        FaultPoint::AfterToolEffect,
        FaultPoint::BeforeStepComplete,
    ];

    /// The points of a delegating call (a tool registered with
    /// [`crate::Tools::delegate`]), beside those of [`FaultPoint::ALL`],
    /// which the child's own turn reaches as any turn does.
    pub const DELEGATION: [FaultPoint; 2] = [FaultPoint::ChildCreated, FaultPoint::ChildAnswered];

    /// The snake_case name used in environment variables and reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::BeforeModelCall => "before_model_call",
            FaultPoint::AfterResponseWritten => "after_response_written",
            FaultPoint::BetweenTools => "between_tools",
            FaultPoint::InsideTransactionalTool => "inside_transactional_tool",
            FaultPoint::AfterToolEffect => "after_tool_effect",
            FaultPoint::BeforeStepComplete => "before_step_complete",
            FaultPoint::AfterClaim => "after_claim",
            FaultPoint::MidSummary => "mid_summary",
            FaultPoint::AfterCompactionComplete => "after_compaction_complete",
            FaultPoint::ChildCreated => "child_created",
            FaultPoint::ChildAnswered => "child_answered",
        }
    }

    /// Parses [`FaultPoint::name`].
    pub fn from_name(name: &str) -> Option<FaultPoint> {
        FaultPoint::ALL
            .into_iter()
            .chain(FaultPoint::DELEGATION)
            .find(|p| p.name() == name)
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Called at every [`FaultPoint`]; an `Err` stops the runner there like a crash.
pub type FaultHook = Arc<dyn Fn(FaultPoint) -> Result<(), FaultPoint> + Send + Sync>;

/// Knobs for crash tests and the chaos harness, kept apart from the everyday
/// settings: a host leaves them at their default.
#[derive(Clone)]
pub struct TestKnobs {
    /// Called at every [`FaultPoint`]; an `Err` stops the runner there as a
    /// crash would. Default None.
    pub fault_hook: Option<FaultHook>,
    /// Renew held leases (turn and compaction) in the background while
    /// working. Default true; false simulates a frozen holder (a GC pause, a
    /// stopped process): its leases expire and it gets fenced.
    pub heartbeat: bool,
    /// Deliberately wrong behaviour, for showing that a harness can fail.
    /// Default: none.
    pub sabotage: Sabotage,
}

impl Default for TestKnobs {
    fn default() -> Self {
        TestKnobs {
            fault_hook: None,
            heartbeat: true,
            sabotage: Sabotage::default(),
        }
    }
}

/// Deliberately broken behaviour a runner can be given, so a harness (the
/// chaos harness of `abridge-testkit`, its `broken-*` builds) can show that it
/// catches the violation. Never set by a host: each breaks a guarantee.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sabotage {
    /// Breaks G5: a completed tool invocation is run again when its step is
    /// resumed.
    pub rerun_completed_effects: bool,
    /// Breaks G4: a step reads a compaction another live runner is still
    /// writing (its draft) instead of waiting for it or reading the one
    /// before.
    pub read_drafts: bool,
}

impl fmt::Debug for TestKnobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestKnobs")
            .field("fault_hook", &self.fault_hook.as_ref().map(|_| "set"))
            .field("heartbeat", &self.heartbeat)
            .field("sabotage", &self.sabotage)
            .finish()
    }
}
