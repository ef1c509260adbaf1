//! Many callers, one write: a `Batcher` hands what its callers submit to one writer, which takes
//! whatever is queued — a single item when the caller is alone, everything that arrived while its
//! previous write was in flight under load — and writes it at once (one statement, one commit).
//! Nothing waits for a batch to fill: at low rates every item is written as it comes.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

pub struct Batcher<T, R> {
    queue: mpsc::Sender<(T, oneshot::Sender<R>)>,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the writer on the current runtime: `write` gets up to `max` items and returns one
    /// result per item, in order. It stops when the last handle is dropped.
    pub fn start<F, Fut>(max: usize, mut write: F) -> Self
    where
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<R>> + Send,
    {
        let (queue, mut pending) = mpsc::channel::<(T, oneshot::Sender<R>)>(4 * max.max(1));
        tokio::spawn(async move {
            while let Some(first) = pending.recv().await {
                let mut batch = vec![first];
                while batch.len() < max {
                    match pending.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<T>, Vec<oneshot::Sender<R>>) = batch.into_iter().unzip();
                let results = write(items).await;
                debug_assert_eq!(results.len(), replies.len(), "one result per item");
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
        });
        Batcher { queue }
    }

    /// Submits `item` and waits for its result; `None` if the writer is gone.
    pub async fn submit(&self, item: T) -> Option<R> {
        let (reply, answer) = oneshot::channel();
        self.queue.send((item, reply)).await.ok()?;
        answer.await.ok()
    }
}

/// `items` written together by `together`, which answers one result per item in order. If the
/// database refuses that write (or answers for other items), each item is written alone by
/// `alone`, so that a bad one fails only itself and each gets its own error. `what` names the
/// items in the warning.
pub async fn together_or_alone<'a, T, R, E, Together, Alone, AloneFut>(
    what: &str,
    items: &'a [T],
    together: Together,
    mut alone: Alone,
) -> Vec<Result<R, E>>
where
    E: std::fmt::Display,
    Together: Future<Output = Result<Vec<R>, E>>,
    Alone: FnMut(&'a T) -> AloneFut,
    AloneFut: Future<Output = Result<R, E>>,
{
    match together.await {
        Ok(results) if results.len() == items.len() => return results.into_iter().map(Ok).collect(),
        Ok(results) => {
            tracing::error!(
                expected = items.len(),
                got = results.len(),
                "a batch write of {what} answered for other items"
            );
        }
        Err(e) if items.len() == 1 => return vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, size = items.len(), "the database refused a batch of {what}; writing them one at a time")
        }
    }
    let mut results = Vec::with_capacity(items.len());
    for item in items {
        results.push(alone(item).await);
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn a_refused_batch_is_written_one_at_a_time_so_only_the_bad_item_fails() {
        let alone = |n: &u32| {
            let n = *n;
            async move { if n == 2 { Err(format!("{n} refused")) } else { Ok(n * 10) } }
        };
        let refused = async { Err::<Vec<u32>, String>("the batch refused".into()) };
        let results = together_or_alone("numbers", &[1u32, 2, 3], refused, alone).await;
        assert_eq!(results, [Ok(10), Err("2 refused".into()), Ok(30)]);
        // answers for other items than asked: each alone too
        let short = async { Ok::<Vec<u32>, String>(vec![10]) };
        assert_eq!(together_or_alone("numbers", &[1u32, 3], short, alone).await, [Ok(10), Ok(30)]);
        // a batch of one that is refused is that item's error, not written again
        let mut tried = 0;
        let one = together_or_alone("numbers", &[1u32], async { Err::<Vec<u32>, String>("no".into()) }, |_| {
            tried += 1;
            async { Ok(0) }
        })
        .await;
        assert_eq!((one, tried), (vec![Err("no".into())], 0));
        let together = async { Ok::<Vec<u32>, String>(vec![7, 8]) };
        assert_eq!(together_or_alone("numbers", &[1u32, 2], together, alone).await, [Ok(7), Ok(8)]);
    }

    #[tokio::test]
    async fn alone_an_item_is_written_at_once_and_together_they_share_writes() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let batcher = Arc::new(Batcher::start(8, move |items: Vec<u32>| {
            seen.lock().unwrap().push(items.len());
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                items.into_iter().map(|n| n * 10).collect::<Vec<_>>()
            }
        }));
        assert_eq!(batcher.submit(1).await, Some(10));
        assert_eq!(*sizes.lock().unwrap(), [1], "alone: no waiting for company");
        let many = (0..20u32).map(|n| {
            let batcher = batcher.clone();
            tokio::spawn(async move { (n, batcher.submit(n).await) })
        });
        for answer in futures_util::future::join_all(many).await {
            let (n, result) = answer.unwrap();
            assert_eq!(result, Some(n * 10), "each caller gets its own result");
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 21);
        assert!(sizes.iter().all(|s| *s <= 8), "never more than max: {sizes:?}");
        assert!(sizes.len() < 21, "callers that came during a write shared the next one: {sizes:?}");
    }
}
