//! A dispatch from delivery to the end of its run: the claim (fenced by this worker and a run
//! token), the secrets opened for the run, the run, and what its outcome becomes.

use super::*;

/// Frees the concurrency slot of a run ended by hand (`db::execution::release`) when dropped, in
/// a task of its own (waiting out a database outage).
struct ReleaseOnDrop {
    db: PgPool,
    execution_id: i64,
    worker_id: i64,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let (db, execution_id, worker_id) = (self.db.clone(), self.execution_id, self.worker_id);
        tokio::spawn(async move { release(&db, Some(execution_id), worker_id).await });
    }
}

/// Says that the processes of a run ended by hand (`None`: of every run of the worker's) are gone,
/// freeing its concurrency slot; waits out a database outage.
pub(crate) async fn release(db: &PgPool, execution_id: Option<i64>, worker_id: i64) {
    let released = db::retry_while_unavailable("releasing a concurrency slot", || {
        db::execution::release(db, execution_id, worker_id)
    })
    .await;
    match released {
        Ok(0) => {}
        Ok(n) => tracing::info!(execution_id, released = n, "concurrency slot freed: the run's processes are gone"),
        Err(e) => tracing::warn!(execution_id, error = %e, "could not free a concurrency slot"),
    }
}

impl Worker {
    /// A dispatch message: each execution it names is claimed, run and recorded on its own, all
    /// at once (each waits for a run slot of its own). The message is acknowledged when every one
    /// is done with, and goes back to the queue if any of them must (the others are then stale
    /// duplicates there).
    pub(crate) async fn handle(&self, incoming: Incoming, shutdown: CancellationToken) -> Disposition {
        let dispatch: Dispatch = match incoming.parse("dispatch") {
            Ok(dispatch) => dispatch,
            Err(disposition) => return disposition,
        };
        // polled as they are woken (not all of them whenever one is)
        let mut each: futures_util::stream::FuturesUnordered<_> = dispatch
            .executions()
            .into_iter()
            .map(|execution_id| {
                let traced = dispatch.trace_of(execution_id).filter(|_| attune_common::trace::on());
                self.handle_one(execution_id, traced, &incoming, &shutdown)
            })
            .collect();
        let mut disposition = Disposition::Ack;
        while let Some(done) = futures_util::StreamExt::next(&mut each).await {
            if matches!(done, Disposition::Retry) {
                disposition = Disposition::Retry;
            }
        }
        disposition
    }

    /// One execution of a dispatch message.
    pub(crate) async fn handle_one(
        &self,
        execution_id: i64,
        dispatched: Option<String>,
        incoming: &Incoming,
        shutdown: &CancellationToken,
    ) -> Disposition {
        let _busy = Busy::new(&self.busy);
        let _in_flight = self.health.start();
        // Held until a run slot is free. It goes back to waiting for any worker (no retry spent)
        // when it has waited `hold_limit` (the runs here take longer than expected, and another
        // worker may start it at once), when the worker stops, and when the channel it came on
        // is lost (the broker returns the message to the queue, where it would expire and fail
        // the execution unstarted). A dispatch that must wait for a run slot is checked for
        // staleness on the way (`wait_for_slot`).
        let immediate = self.run_slots.try_acquire().ok();
        // held (marked with each heartbeat) until its claim has answered
        let held = Held::new(&self.held, execution_id);
        let mut held_too_long = false;
        let permit = match immediate {
            Some(permit) => Some(permit),
            None => tokio::select! {
                permit = self.wait_for_slot(execution_id) => match permit {
                    Some(permit) => Some(permit),
                    None => return Disposition::Ack,
                },
                _ = tokio::time::sleep(self.hold_limit()) => {
                    held_too_long = true;
                    None
                }
                _ = shutdown.cancelled() => None,
                _ = incoming.channel_lost.cancelled() => None,
            },
        };
        if incoming.channel_lost.is_cancelled() && permit.is_none() {
            // (the message's redelivery, if it comes, finds the execution no longer here)
            self.give_back_held(execution_id, "its channel was lost").await;
            return Disposition::Retry;
        }
        if held_too_long {
            self.give_back_held(execution_id, "every run slot is still taken").await;
            return Disposition::Ack;
        }
        if incoming.channel_lost.is_cancelled() {
            return Disposition::Retry;
        }
        let Some(permit) = permit.filter(|_| !shutdown.is_cancelled()) else {
            if self.displaced.load(std::sync::atomic::Ordering::SeqCst) {
                // back to the queue, for the new holder of the name
                return Disposition::Retry;
            }
            return self.hand_back(execution_id).await;
        };
        if self.lease.expired() {
            // the executors may take this worker for dead any moment: the dispatch waits for
            // another (or for this one once its heartbeats land again)
            self.give_back_held(execution_id, "no heartbeat has landed within the lease").await;
            return Disposition::Ack;
        }
        if self.health.unfit() {
            // its lease file cannot be renewed (`Worker::tell_lease`): it reports itself
            // unhealthy, and the dispatch waits for another worker
            self.give_back_held(execution_id, "the worker's lease file cannot be renewed").await;
            return Disposition::Ack;
        }
        // one claim per execution in this process at a time: a second delivery of the same one
        // waits for nothing (so a claim read back after a lost acknowledgement is this one's)
        if !self.running.lock().expect("running map poisoned").reserve(execution_id) {
            tracing::debug!(execution_id, "dispatch is a duplicate of one claimed or running here");
            return Disposition::Ack;
        }
        // the claim reads what to run from the database: nothing of the message but the ids is
        // believed (a forged dispatch for an execution not scheduled here claims nothing)
        let run_token = new_run_token();
        let lapses = self.lease.lapses();
        let claimed = self.writes.claim(execution_id, &run_token).await;
        drop(held);
        if !matches!(claimed, Ok(Some(_))) {
            self.running.lock().expect("running map poisoned").release(execution_id);
        }
        let claimed = match claimed {
            Ok(Some(claimed)) => claimed,
            Ok(None) => {
                tracing::debug!(execution_id, "dispatch is stale or a duplicate");
                return Disposition::Ack;
            }
            Err(e) => {
                tracing::warn!(execution_id, error = %e, "could not claim execution");
                return Disposition::Retry;
            }
        };
        if self.lease.lapses() != lapses || self.lease.expired() {
            // The claim's answer came after the lease ran out: the executors may have taken
            // this worker for dead meanwhile and started the execution elsewhere. It does not run
            // here (its failure is reported, and is stale if it was).
            self.running.lock().expect("running map poisoned").release(execution_id);
            let result = ExecutionResult {
                trace: claimed
                    .trace_parent
                    .as_deref()
                    .filter(|_| attune_common::trace::on())
                    .and_then(attune_common::trace::valid),
                ..failure_result(
                    execution_id,
                    self.id,
                    Some(run_token),
                    FailureKind::WorkerHeartbeatStale,
                    "the worker's lease on its runs ran out while it claimed the execution: not started".into(),
                )
            };
            self.report(&result).await;
            return Disposition::Ack;
        }
        let started = Instant::now();
        // the `run` span (when traces are on): under the executor's `dispatch` span when the
        // message names one in the execution's own trace (the row's; a message does not choose
        // it), else under the row's; the action gets its context
        let mut span = attune_common::trace::Span::default();
        if attune_common::trace::on() {
            let row = claimed.trace_parent.as_deref().and_then(attune_common::trace::valid);
            let parent = match (dispatched, row) {
                (Some(sent), Some(row)) if attune_common::trace::same_trace(&sent, &row) => Some(sent),
                (Some(sent), None) => Some(sent),
                (_, row) => row,
            };
            span = attune_common::trace::span(
                "run",
                attune_common::trace::Kind::Consumer,
                Some(execution_id),
                parent.as_deref(),
            );
            span.attribute("attune.worker_id", self.id);
            span.attribute("attune.action", claimed.action_ref.clone());
        }
        let traceparent = span.traceparent();
        let (cancel, kill) = (self.abort.child_token(), CancellationToken::new());
        let runtime = claimed.runtime.as_deref().unwrap_or_default();
        let transient_exit_codes = transient_exit_codes(claimed.retry_policy.as_ref());
        let timeout_seconds = claimed.timeout_seconds.unwrap_or(self.settings.common.default_timeout_secs);
        // secrets referred to or sealed among the parameters, opened for this run alone; every
        // value opened is redacted from what the run produced before it is recorded
        let opened = attune_common::secrets::open(
            &self.db,
            self.settings.sealer.as_ref(),
            execution_id,
            &claimed.action_ref,
            &claimed.parameters,
        )
        .await;
        let (opened, unopened) = match opened {
            Ok(opened) => (opened, None),
            Err(error) => (None, Some(error)),
        };
        let parameters = opened.as_ref().map_or(&claimed.parameters, |opened| &opened.parameters);
        let redactor = opened.as_ref().map(|opened| &opened.redactor);
        let run = ActionRun {
            execution_id,
            action_ref: &claimed.action_ref,
            runtime,
            pack_path: PathBuf::from(claimed.pack_path.as_deref().unwrap_or_default()),
            entrypoint: claimed.entrypoint.as_deref().unwrap_or_default(),
            parameters,
            timeout: Duration::from_secs(timeout_seconds.max(1) as u64),
            retry_count: claimed.retry_count,
            output_limit: self.settings.output_limit,
            transient_exit_codes: &transient_exit_codes,
            http: claimed.http.as_ref(),
            idempotency_key: &claimed.idempotency_key,
            limits: claimed.limits.as_ref(),
            kill: Some(&kill),
            traceparent: traceparent.as_deref(),
            capture: None,
        };
        // a process run is followable while it runs (`live`): its output readers keep what they
        // read where a follow request finds it (a builtin or http action has no output meanwhile)
        let live = (!matches!(runtime, "builtin" | "http")).then(|| {
            let output_limit = crate::supervise::limits_for(claimed.limits.as_ref(), self.settings.output_limit)
                .map_or(self.settings.output_limit, |limits| {
                    usize::try_from(limits.output_bytes).unwrap_or(usize::MAX)
                });
            let live = live::LiveRun::new(execution_id, redactor.cloned(), output_limit);
            self.live.lock().expect("live map poisoned").insert(execution_id, live.clone());
            live
        });
        let run = ActionRun { capture: live.as_ref().map(|live| &live.capture), ..run };
        self.running.lock().expect("running map poisoned").start(execution_id, &cancel, &kill);
        // (an action removed since it was dispatched: nothing to run, and not this worker's fault)
        let action_gone = claimed.runtime.is_none();
        let mut ran = match (action_gone, unopened) {
            (true, _) => Ran::of(runner::Outcome {
                status: ResultStatus::Failed,
                failure_kind: Some(FailureKind::ActionNotFound),
                error: Some(format!("action '{}' no longer exists", claimed.action_ref)),
                result: None,
            }),
            (false, Some(unopened)) => {
                let (failure_kind, error) = match unopened {
                    attune_common::secrets::Unopened::Invalid(error) => (FailureKind::InvalidParameters, error),
                    attune_common::secrets::Unopened::Unavailable(error) => (FailureKind::TransientError, error),
                };
                Ran::of(runner::Outcome {
                    status: ResultStatus::Failed,
                    failure_kind: Some(failure_kind),
                    error: Some(error),
                    result: None,
                })
            }
            (false, None) => self.runtimes.execute(&run, &cancel).await,
        };
        if let Some(redactor) = redactor.filter(|redactor| !redactor.is_empty()) {
            ran.stdout = redactor.text(&ran.stdout);
            ran.stderr = redactor.text(&ran.stderr);
            ran.outcome.error = ran.outcome.error.map(|error| redactor.text(&error));
            if let Some(result) = ran.outcome.result.as_mut() {
                redactor.json(result);
            }
        }
        self.running.lock().expect("running map poisoned").end(execution_id);
        // its processes are gone: once its outcome is recorded or reported (however this ends),
        // a run ended by hand meanwhile gives its key's slot back, though the worker may never
        // have heard of the cancel (a run not ended by hand has nothing to give back: one
        // statement, for limited actions only)
        let _release = claimed.concurrency_limited.then(|| ReleaseOnDrop {
            db: self.db.clone(),
            execution_id,
            worker_id: self.id,
        });
        if let Some(live) = live {
            self.live.lock().expect("live map poisoned").remove(&execution_id);
            live.ended.cancel();
        }
        // the slot is for running an action: the next one may start while this one is recorded
        drop(permit);
        if self.lease_lost.lock().expect("lease poisoned").remove(&execution_id) {
            let lease = self.settings.lease().as_secs_f64();
            let result = ExecutionResult {
                trace: span.traceparent(),
                ..failure_result(
                    execution_id,
                    self.id,
                    Some(run_token),
                    FailureKind::WorkerHeartbeatStale,
                    format!(
                        "the worker's heartbeats did not land for {lease:.1} s (its lease): the run was stopped so that it can run elsewhere"
                    ),
                )
            };
            self.report(&result).await;
            return Disposition::Ack;
        }
        if cancel.is_cancelled() && !self.abort.is_cancelled() {
            // A client canceled it (or an operator failed it): the record already says so, and
            // keeps its concurrency slot until told its processes are gone (they are, by now)
            let stopped = match runtime {
                "http" => "stopped while running (canceled or failed by hand); request aborted",
                _ => "stopped while running (canceled or failed by hand); process group killed",
            };
            tracing::info!(execution_id, "{stopped}");
            // what it printed until then stays with the record (bounded: the ack goes anyway)
            let keep = db::execution::keep_stopped_output(
                &self.db,
                execution_id,
                self.id,
                Some(run_token.as_str()),
                &ran.stdout,
                &ran.stderr,
            );
            match tokio::time::timeout(REPORT_WRITE_LIMIT, keep).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(execution_id, error = %e, "the stopped run's output was not kept"),
                Err(_) => tracing::warn!(execution_id, "keeping the stopped run's output took too long"),
            }
            return Disposition::Ack;
        }
        let outcome = ran.outcome;
        let duration_ms = started.elapsed().as_millis() as u64;
        let worker_failed = outcome.failure_kind.is_some_and(FailureKind::counts_against_worker) && !action_gone;
        let after = self.health.finish(worker_failed, duration_ms);
        // executors dispatch by the slots and the health of the last heartbeat, and time their
        // looks at a full worker by its recent execution time: a change of any is sent early
        self.reported.send_if_modified(|reported| {
            let now = (self.lookahead_now(), after.class, after.last_failure_at);
            let changed =
                (reported.0, reported.1, reported.2) != now || run_time_moved(reported.3, after.recent_duration_ms);
            if changed {
                *reported = (now.0, now.1, now.2, after.recent_duration_ms);
            }
            changed
        });
        // the `record` span: the success written here, or the failure reported to the executors
        let recording = attune_common::trace::span(
            "record",
            attune_common::trace::Kind::Producer,
            Some(execution_id),
            traceparent.as_deref(),
        );
        let result = ExecutionResult {
            trace: recording.traceparent(),
            execution_id,
            worker_id: self.id,
            status: outcome.status,
            result: outcome.result,
            failure_kind: outcome.failure_kind,
            error: outcome.error,
            exit_code: ran.exit_code,
            stdout: ran.stdout,
            stderr: ran.stderr,
            duration_ms,
            http_status: ran.http_status,
            retry_after_ms: ran.retry_after.map(|after| after.as_millis() as u64),
            run_token: Some(run_token),
        };
        attune_common::metrics::increment(
            &attune_common::metrics::ACTIONS_RUN,
            &[("runtime", runtime), ("status", result.status.as_str())],
            1,
        );
        if result.status != ResultStatus::Completed || !self.record_success(&result).await {
            // (the row, if the database answers, and the message at once: neither waits for the
            // other)
            tokio::join!(self.keep_report(&result), self.report(&result));
        }
        drop(recording);
        drop(span);
        Disposition::Ack
    }
}
