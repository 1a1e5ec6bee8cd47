// The fold's state rule, as schemas/fold.py has it (steps_of, state_after): the dashboard's
// live path moves a job with it, so the page and the read model agree on every state. The
// targets come from the server (the state machine's table); tests/unit/test_state_rule.py
// runs this file under node against the cases the Python fold accepts.
"use strict";

function stepsOf(type, skipped) {
  // A job.created that skips steps skips those after it; any other event's come before it.
  return type === "job.created" ? [type, ...skipped] : [...skipped, type];
}

function stateAfter(targets, state, type, skipped) {
  for (const step of stepsOf(type, skipped || [])) {
    const target = targets[step];
    if (target) state = target;  // lease events keep the state
  }
  return state;
}

if (typeof module !== "undefined") module.exports = { stepsOf, stateAfter };
