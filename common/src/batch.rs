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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

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
