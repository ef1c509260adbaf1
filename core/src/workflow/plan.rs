//! What a workflow run does next, decided from its definition, its input and the latest attempt
//! of each of its steps' items. Nothing else is read, so the decision is the same however many
//! times it is taken: an item is started only if it has no execution yet (the record's unique
//! key makes a second start of it a no-op), a step is done only when all its items are.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::expr::{Condition, render};
use super::{MOST_ITEMS, StepSpec, WorkflowSpec};
use crate::ExecutionStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Main,
    OnFailure,
}

/// The latest attempt of one item of a step (a step without `with-items` has one, item 0).
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub execution: i64,
    pub status: ExecutionStatus,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Waits for the steps it needs.
    Waiting,
    Running,
    Succeeded,
    Failed,
    /// Its `when` was false.
    Skipped,
    /// A step it needs failed, or the run failed before it: it never runs.
    NotRun,
}

impl StepState {
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Waiting => "waiting",
            StepState::Running => "running",
            StepState::Succeeded => "succeeded",
            StepState::Failed => "failed",
            StepState::Skipped => "skipped",
            StepState::NotRun => "not_run",
        }
    }

    fn done(self) -> bool {
        matches!(self, StepState::Succeeded | StepState::Skipped)
    }
}

/// How many of a step's items are where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ItemState {
    pub total: usize,
    pub not_started: usize,
    pub in_flight: usize,
    pub succeeded: usize,
    pub failed: usize,
}

/// One step as the plan sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    pub name: String,
    pub action: String,
    pub phase: Phase,
    pub state: StepState,
    pub needs: Vec<String>,
    /// For a `with-items` step, once its list is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemState>,
    /// Why it was skipped, or failed without an execution of its own (an expression's error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An item to start: an execution of `action` with `parameters`.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub step: String,
    pub item: i32,
    pub action: String,
    pub parameters: Value,
}

/// How the run ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub succeeded: bool,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// The step whose failure failed the run.
    pub failed_step: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub steps: Vec<StepView>,
    pub start: Vec<Start>,
    pub finish: Option<Finish>,
}

/// The first failure of a phase: what an on-failure step sees as `failure`.
#[derive(Debug, Clone)]
struct Failure {
    step: String,
    item: Option<i32>,
    execution: Option<i64>,
    error: String,
}

impl Failure {
    fn value(&self) -> Value {
        json!({"step": self.step, "item": self.item, "execution": self.execution, "error": self.error})
    }

    fn message(&self) -> String {
        match self.item {
            Some(item) => format!("step '{}' failed (item {item}): {}", self.step, self.error),
            None => format!("step '{}' failed: {}", self.step, self.error),
        }
    }
}

/// What one list of steps (main or on-failure) came to.
struct Evaluated {
    failure: Option<Failure>,
    in_flight: bool,
    all_done: bool,
    start: Vec<Start>,
}

/// The next move of a run of `spec` with `input` (the run's parameters), given `attempts`: the
/// latest attempt of each (step, item) that has an execution.
pub fn plan(spec: &WorkflowSpec, input: &Value, attempts: &BTreeMap<(String, i32), Attempt>) -> Plan {
    let mut scope = json!({"input": input, "steps": {}});
    let mut views = Vec::new();
    let main = evaluate(&spec.steps, Phase::Main, &mut scope, attempts, &mut views);
    let Some(failure) = main.failure else {
        let finish = main.all_done.then(|| finished(spec, &scope));
        // the on-failure steps wait for a failure; once the run is over, none came
        let state = if finish.is_some() { StepState::NotRun } else { StepState::Waiting };
        views.extend(spec.on_failure.iter().map(|s| StepView { state, ..waiting_view(s, Phase::OnFailure) }));
        return Plan { steps: views, start: main.start, finish };
    };
    // nothing more of the main steps starts; the on-failure steps wait for what is in flight
    for view in views.iter_mut().filter(|v| v.state == StepState::Waiting) {
        view.state = StepState::NotRun;
    }
    if main.in_flight {
        let on_failure = spec.on_failure.iter().map(|s| waiting_view(s, Phase::OnFailure));
        views.extend(on_failure);
        return Plan { steps: views, start: Vec::new(), finish: None };
    }
    for step in &spec.steps {
        let steps = scope["steps"].as_object_mut().expect("steps is an object");
        steps.entry(step.name.clone()).or_insert_with(|| json!({"status": "not_run", "result": null}));
    }
    scope["failure"] = failure.value();
    let after = evaluate(&spec.on_failure, Phase::OnFailure, &mut scope, attempts, &mut views);
    let finish = (!after.in_flight && (after.all_done || after.failure.is_some())).then(|| Finish {
        succeeded: false,
        result: None,
        error: Some(match &after.failure {
            Some(also) => format!("{}; then on-failure {}", failure.message(), also.message()),
            None => failure.message(),
        }),
        failed_step: Some(failure.step.clone()),
    });
    let start = if after.failure.is_some() { Vec::new() } else { after.start };
    Plan { steps: views, start, finish }
}

fn finished(spec: &WorkflowSpec, scope: &Value) -> Finish {
    let result = match &spec.result {
        Some(template) => render(template, scope),
        None => {
            let steps = scope["steps"].as_object().cloned().unwrap_or_default();
            Ok(Value::Object(steps.into_iter().map(|(name, step)| (name, step["result"].clone())).collect()))
        }
    };
    match result {
        Ok(result) => Finish { succeeded: true, result: Some(result), error: None, failed_step: None },
        Err(e) => Finish { succeeded: false, result: None, error: Some(format!("the result: {e}")), failed_step: None },
    }
}

fn waiting_view(step: &StepSpec, phase: Phase) -> StepView {
    StepView {
        name: step.name.clone(),
        action: step.action.clone(),
        phase,
        state: StepState::Waiting,
        needs: step.needs.clone().unwrap_or_default(),
        items: None,
        reason: None,
    }
}

fn evaluate(
    steps: &[StepSpec],
    phase: Phase,
    scope: &mut Value,
    attempts: &BTreeMap<(String, i32), Attempt>,
    views: &mut Vec<StepView>,
) -> Evaluated {
    let mut out = Evaluated { failure: None, in_flight: false, all_done: true, start: Vec::new() };
    let mut states: BTreeMap<&str, StepState> = BTreeMap::new();
    let mut previous: Option<&str> = None;
    for step in steps {
        let needs = step.needs(previous);
        previous = Some(&step.name);
        let mut view = StepView { needs: needs.iter().map(|n| n.to_string()).collect(), ..waiting_view(step, phase) };
        let needed: Vec<StepState> =
            needs.iter().map(|n| states.get(n).copied().unwrap_or(StepState::Waiting)).collect();
        let (state, step_failure, in_flight) =
            if needed.iter().any(|s| matches!(s, StepState::Failed | StepState::NotRun)) {
                (StepState::NotRun, None, 0)
            } else if !needed.iter().all(|s| s.done()) {
                (StepState::Waiting, None, 0)
            } else {
                one_step(step, scope, attempts, &mut view, &mut out.start)
            };
        view.state = state;
        out.in_flight |= in_flight > 0;
        if !state.done() {
            out.all_done = false;
        }
        if let Some(failure) = step_failure
            && out.failure.is_none()
        {
            out.failure = Some(failure);
        }
        states.insert(&step.name, state);
        views.push(view);
    }
    // a failure stops every start of this list
    if out.failure.is_some() {
        out.start.clear();
    }
    out
}

/// The state of a step whose needs are done: `Some` failure when it failed, and how many of its
/// items have an execution not finished.
fn one_step(
    step: &StepSpec,
    scope: &mut Value,
    attempts: &BTreeMap<(String, i32), Attempt>,
    view: &mut StepView,
    start: &mut Vec<Start>,
) -> (StepState, Option<Failure>, usize) {
    let (state, failure) = step_state(step, scope, attempts, view, start);
    let in_flight = (0..view.items.map_or(1, |i| i.total) as i32)
        .filter(|item| attempts.get(&(step.name.clone(), *item)).is_some_and(|a| !a.status.is_terminal()))
        .count();
    (state, failure, in_flight)
}

fn step_state(
    step: &StepSpec,
    scope: &mut Value,
    attempts: &BTreeMap<(String, i32), Attempt>,
    view: &mut StepView,
    start: &mut Vec<Start>,
) -> (StepState, Option<Failure>) {
    let failed = |error: String, view: &mut StepView, scope: &mut Value| {
        view.reason = Some(error.clone());
        record(scope, &step.name, json!({"status": "failed", "result": null, "error": error}));
        (StepState::Failed, Some(Failure { step: step.name.clone(), item: None, execution: None, error }))
    };
    if let Some(when) = &step.when {
        match Condition::parse(when).and_then(|c| c.eval(scope)) {
            Ok(true) => {}
            Ok(false) => {
                view.reason = Some(format!("'when' is false: {when}"));
                record(scope, &step.name, json!({"status": "skipped", "result": null}));
                return (StepState::Skipped, None);
            }
            Err(e) => return failed(format!("its 'when': {e}"), view, scope),
        }
    }
    let items: Option<Vec<Value>> = match &step.with_items {
        None => None,
        Some(template) => match render(template, scope) {
            Ok(Value::Array(items)) if items.len() <= MOST_ITEMS => Some(items),
            Ok(Value::Array(items)) => {
                return failed(format!("'with-items' gave {} items, more than {MOST_ITEMS}", items.len()), view, scope);
            }
            Ok(other) => return failed(format!("'with-items' gave {other}, not a list"), view, scope),
            Err(e) => return failed(format!("its 'with-items': {e}"), view, scope),
        },
    };
    let total = items.as_ref().map_or(1, Vec::len);
    let mut counts = ItemState { total, ..Default::default() };
    let mut results = Vec::with_capacity(total);
    let mut first_failed: Option<(i32, &Attempt)> = None;
    let mut not_started = Vec::new();
    for item in 0..total as i32 {
        match attempts.get(&(step.name.clone(), item)) {
            None => {
                counts.not_started += 1;
                not_started.push(item);
                results.push(Value::Null);
            }
            Some(attempt) if !attempt.status.is_terminal() => {
                counts.in_flight += 1;
                results.push(Value::Null);
            }
            Some(attempt) if attempt.status == ExecutionStatus::Completed => {
                counts.succeeded += 1;
                results.push(attempt.result.clone().unwrap_or(Value::Null));
            }
            Some(attempt) => {
                counts.failed += 1;
                first_failed.get_or_insert((item, attempt));
                results.push(Value::Null);
            }
        }
    }
    if items.is_some() {
        view.items = Some(counts);
    }
    if let Some((item, attempt)) = first_failed {
        let error = attempt.error.clone().unwrap_or_else(|| format!("it ended {}", attempt.status.as_str()));
        if counts.in_flight > 0 {
            return (StepState::Running, None);
        }
        let failure = Failure {
            step: step.name.clone(),
            item: items.is_some().then_some(item),
            execution: Some(attempt.execution),
            error: error.clone(),
        };
        record(
            scope,
            &step.name,
            json!({"status": "failed", "result": null, "error": error, "exit_code": attempt.exit_code}),
        );
        return (StepState::Failed, Some(failure));
    }
    if counts.succeeded == total {
        let result = match items {
            Some(_) => Value::Array(results),
            None => results.pop().unwrap_or(Value::Null),
        };
        record(scope, &step.name, json!({"status": "succeeded", "result": result}));
        return (StepState::Succeeded, None);
    }
    let room = match items {
        Some(_) => (step.concurrency() as usize).saturating_sub(counts.in_flight),
        None => 1,
    };
    for item in not_started.into_iter().take(room) {
        if let Some(items) = &items {
            scope["item"] = items[item as usize].clone();
            scope["index"] = json!(item);
        }
        let parameters = render(&Value::Object(step.parameters.clone().into_iter().collect::<Map<_, _>>()), scope);
        if let Some(object) = scope.as_object_mut() {
            object.remove("item");
            object.remove("index");
        }
        match parameters {
            Ok(parameters) => {
                start.push(Start { step: step.name.clone(), item, action: step.action.clone(), parameters })
            }
            // an item that cannot be started fails the step; items in flight run out first
            Err(e) => {
                let error = match items {
                    Some(_) => format!("item {item}'s parameters: {e}"),
                    None => format!("its parameters: {e}"),
                };
                start.retain(|s| s.step != step.name);
                if counts.in_flight > 0 {
                    view.reason = Some(error);
                    return (StepState::Running, None);
                }
                return failed(error, view, scope);
            }
        }
    }
    (StepState::Running, None)
}

fn record(scope: &mut Value, name: &str, value: Value) {
    scope["steps"][name] = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::parse;
    use std::path::Path;

    fn spec(text: &str) -> WorkflowSpec {
        parse(Path::new("w.yaml"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn done(execution: i64, result: Value) -> Attempt {
        Attempt {
            execution,
            status: ExecutionStatus::Completed,
            result: Some(result),
            error: None,
            exit_code: Some(0),
            attempts: 1,
        }
    }

    fn failed(execution: i64, error: &str) -> Attempt {
        Attempt {
            execution,
            status: ExecutionStatus::Failed,
            result: None,
            error: Some(error.into()),
            exit_code: Some(1),
            attempts: 1,
        }
    }

    fn running(execution: i64) -> Attempt {
        Attempt { execution, status: ExecutionStatus::Running, result: None, error: None, exit_code: None, attempts: 1 }
    }

    type Record = BTreeMap<(String, i32), Attempt>;

    fn with(record: &mut Record, step: &str, item: i32, attempt: Attempt) {
        record.insert((step.to_string(), item), attempt);
    }

    const CHAIN: &str = "name: w\ninput:\n  who: {type: string}\nsteps:\n  - {name: a, action: p.x, parameters: {m: 'hi {{ input.who }}'}}\n  - {name: b, action: p.y, parameters: {m: '{{ steps.a.result.n }}'}}\nresult: '{{ steps.b.result }}'\n";

    #[test]
    fn a_sequence_starts_each_step_after_the_one_before_and_ends_with_its_result() {
        let spec = spec(CHAIN);
        let input = json!({"who": "ops"});
        let mut record = Record::new();
        let first = plan(&spec, &input, &record);
        assert_eq!(
            first.start,
            vec![Start { step: "a".into(), item: 0, action: "p.x".into(), parameters: json!({"m": "hi ops"}) }]
        );
        assert_eq!(first.finish, None);
        with(&mut record, "a", 0, running(1));
        assert!(plan(&spec, &input, &record).start.is_empty(), "a is in flight: nothing new");
        with(&mut record, "a", 0, done(1, json!({"n": 7})));
        let second = plan(&spec, &input, &record);
        assert_eq!(second.start[0].parameters, json!({"m": 7}));
        with(&mut record, "b", 0, done(2, json!("ok")));
        let last = plan(&spec, &input, &record);
        assert!(last.start.is_empty());
        assert_eq!(
            last.finish,
            Some(Finish { succeeded: true, result: Some(json!("ok")), error: None, failed_step: None })
        );
        assert!(last.steps.iter().all(|s| s.state == StepState::Succeeded));
    }

    const FAN_OUT: &str = "name: w\ninput:\n  hosts: {type: array}\nsteps:\n  - {name: each, action: p.x, with-items: '{{ input.hosts }}', concurrency: 2, parameters: {host: '{{ item }}', n: '{{ index }}'}}\n  - {name: join, action: p.y, parameters: {all: '{{ steps.each.result }}'}}\n";

    #[test]
    fn with_items_keeps_to_its_concurrency_and_joins_once_every_item_is_done() {
        let spec = spec(FAN_OUT);
        let input = json!({"hosts": ["h0", "h1", "h2", "h3", "h4"]});
        let mut record = Record::new();
        let first = plan(&spec, &input, &record);
        let items: Vec<(i32, Value)> = first.start.iter().map(|s| (s.item, s.parameters.clone())).collect();
        assert_eq!(items, vec![(0, json!({"host": "h0", "n": 0})), (1, json!({"host": "h1", "n": 1}))]);
        with(&mut record, "each", 0, done(10, json!("r0")));
        with(&mut record, "each", 1, running(11));
        let next = plan(&spec, &input, &record);
        assert_eq!(next.start.iter().map(|s| s.item).collect::<Vec<_>>(), vec![2], "one slot came free");
        assert_eq!(
            next.steps[0].items,
            Some(ItemState { total: 5, not_started: 3, in_flight: 1, succeeded: 1, failed: 0 })
        );
        for item in 1..4 {
            with(&mut record, "each", item, done(10 + item as i64, json!(format!("r{item}"))));
        }
        let almost = plan(&spec, &input, &record);
        assert!(almost.start.iter().all(|s| s.step == "each"), "the join waits for the last item: {:?}", almost.start);
        with(&mut record, "each", 4, done(14, json!("r4")));
        let joined = plan(&spec, &input, &record);
        assert_eq!(joined.start.len(), 1);
        assert_eq!(joined.start[0].parameters, json!({"all": ["r0", "r1", "r2", "r3", "r4"]}));
    }

    #[test]
    fn an_empty_list_is_done_at_once() {
        let spec = spec(FAN_OUT);
        let plan = plan(&spec, &json!({"hosts": []}), &Record::new());
        assert_eq!(plan.start[0].step, "join");
        assert_eq!(plan.start[0].parameters, json!({"all": []}));
    }

    const BRANCH: &str = "name: w\nsteps:\n  - {name: check, action: p.x}\n  - {name: fix, action: p.y, needs: [check], when: '{{ steps.check.result.healthy }} == false'}\n  - {name: fine, action: p.z, needs: [check], when: '{{ steps.check.result.healthy }}'}\n  - {name: report, action: p.r, needs: [fix, fine], parameters: {fixed: '{{ steps.fix.status }}'}}\n";

    #[test]
    fn when_branches_on_a_result_and_a_skipped_step_counts_as_done() {
        let spec = spec(BRANCH);
        let mut record = Record::new();
        with(&mut record, "check", 0, done(1, json!({"healthy": false})));
        let plan1 = plan(&spec, &json!({}), &record);
        assert_eq!(plan1.start.iter().map(|s| s.step.as_str()).collect::<Vec<_>>(), ["fix"]);
        assert_eq!(plan1.steps[2].state, StepState::Skipped);
        with(&mut record, "fix", 0, done(2, json!(null)));
        let plan2 = plan(&spec, &json!({}), &record);
        assert_eq!(plan2.start[0].step, "report");
        assert_eq!(plan2.start[0].parameters, json!({"fixed": "succeeded"}));
    }

    const ON_FAILURE: &str = "name: w\nsteps:\n  - {name: a, action: p.x}\n  - {name: b, action: p.y}\non-failure:\n  - {name: page, action: p.page, parameters: {m: '{{ failure.step }}: {{ failure.error }}'}}\n";

    #[test]
    fn a_failure_runs_the_on_failure_steps_then_fails_the_run() {
        let spec = spec(ON_FAILURE);
        let mut record = Record::new();
        with(&mut record, "a", 0, failed(1, "exit 3"));
        let plan1 = plan(&spec, &json!({}), &record);
        assert_eq!(plan1.start.len(), 1);
        assert_eq!(plan1.start[0].parameters, json!({"m": "a: exit 3"}));
        assert_eq!(plan1.steps[1].state, StepState::NotRun);
        assert_eq!(plan1.finish, None);
        with(&mut record, "page", 0, done(2, json!(null)));
        let plan2 = plan(&spec, &json!({}), &record);
        let finish = plan2.finish.unwrap();
        assert!(!finish.succeeded);
        assert_eq!(finish.error.as_deref(), Some("step 'a' failed: exit 3"));
        assert_eq!(finish.failed_step.as_deref(), Some("a"));
    }

    #[test]
    fn a_failed_item_starts_no_more_and_the_on_failure_path_waits_for_items_in_flight() {
        let spec = spec(&format!("{FAN_OUT}on-failure:\n  - {{name: page, action: p.page}}\n"));
        let input = json!({"hosts": ["h0", "h1", "h2"]});
        let mut record = Record::new();
        with(&mut record, "each", 0, failed(1, "boom"));
        with(&mut record, "each", 1, running(2));
        let plan1 = plan(&spec, &input, &record);
        assert!(plan1.start.is_empty(), "{:?}", plan1.start);
        assert_eq!(plan1.finish, None);
        with(&mut record, "each", 1, done(2, json!(1)));
        let plan2 = plan(&spec, &input, &record);
        assert_eq!(plan2.start.iter().map(|s| s.step.as_str()).collect::<Vec<_>>(), ["page"]);
        assert_eq!(plan2.steps[0].state, StepState::Failed);
    }

    #[test]
    fn an_expression_that_fails_fails_its_step_with_the_reason() {
        let spec = spec(CHAIN);
        let mut record = Record::new();
        with(&mut record, "a", 0, done(1, json!("no object")));
        let plan = plan(&spec, &json!({"who": "x"}), &record);
        let finish = plan.finish.unwrap();
        assert_eq!(
            finish.error.as_deref(),
            Some("step 'b' failed: its parameters: steps.a.result is a string, which has no 'n'")
        );
    }

    #[test]
    fn without_a_result_template_the_run_s_result_is_each_step_s() {
        let spec = spec("name: w\nsteps:\n  - {name: a, action: p.x}\n  - {name: b, action: p.x, when: 'false'}\n");
        let mut record = Record::new();
        with(&mut record, "a", 0, done(1, json!(5)));
        assert_eq!(plan(&spec, &json!({}), &record).finish.unwrap().result, Some(json!({"a": 5, "b": null})));
    }
}
