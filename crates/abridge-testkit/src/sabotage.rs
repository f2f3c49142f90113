//! The deliberately broken builds: the `broken-idempotency` and
//! `broken-draft-read` features of this crate (and of `abridge-cli`) turn on
//! the engine's sabotage knobs in every runner the demo and the chaos harness
//! build, so `crates/abridge-cli/tests/harness_can_fail.sh` can show the harness catching each.
//! The engine's code paths carry no `cfg!` for them: a knob is a field of
//! [`abridge::TestKnobs`], off unless a test kit sets it.

use abridge::fault::Sabotage;

/// The sabotage this build asks for.
pub fn this_build() -> Sabotage {
    Sabotage {
        rerun_completed_effects: cfg!(feature = "broken-idempotency"),
        read_drafts: cfg!(feature = "broken-draft-read"),
    }
}

/// `knobs` with this build's sabotage.
pub fn apply(mut knobs: abridge::TestKnobs) -> abridge::TestKnobs {
    knobs.sabotage = this_build();
    knobs
}
