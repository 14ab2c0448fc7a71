//! A launch joining its stream's open batch (docs/COMPUTE.md, "Measuring device time"): decided
//! once, under one look at the process's open batches, before the launch. A launch that finds its
//! stream's batch open is counted in it there and then, and one that fills it takes it out to
//! record its end after the launch: a launch that continues a batch looks at the open batches once,
//! not three times (whether it begins one, before, and to count itself, after). Pure, unit-tested;
//! the batches themselves are `participation::events`.

use crate::scheduling::flow::{self, StreamKey};

/// An open batch as this decision sees it: its stream (and context), and the launches counted in it.
pub trait OpenBatch {
    fn stream(&self) -> (StreamKey, usize);
    fn launches(&mut self) -> &mut u32;
}

/// What a launch found of its stream's batch, before it reached the driver.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined<B> {
    /// Nothing open on the stream: the launch begins a batch (after flow control).
    Begins,
    /// Counted in the stream's open batch. `Some`: the launch fills it; the batch is out of the
    /// open list, its end to be recorded after the launch.
    Counted(Option<B>),
}

/// Counts a launch on `stream` in its open batch, if there is one in `open` (`batch`: the launches
/// one batch spans now, `flow::batch_len`), and takes the batch out when the launch fills it.
pub fn join<B: OpenBatch>(open: &mut Vec<B>, stream: (StreamKey, usize), batch: u32) -> Joined<B> {
    let Some(i) = open.iter().position(|o| o.stream() == stream) else {
        return Joined::Begins;
    };
    let n = open[i].launches();
    *n = n.saturating_add(1);
    if flow::closes(*n, batch) {
        Joined::Counted(Some(open.swap_remove(i)))
    } else {
        Joined::Counted(None)
    }
}

/// Undoes [`join`] for a launch that did not reach the driver after all (it went back to the gate):
/// a batch it took out goes back into `open` less this launch (unless the stream has begun another
/// meanwhile: then it is returned, to be closed as it is), one it was counted in loses the count.
/// A batch closed meanwhile by another thread is left as it is (it counted one launch too many).
pub fn unjoin<B: OpenBatch>(
    open: &mut Vec<B>,
    stream: (StreamKey, usize),
    joined: Joined<B>,
) -> Option<B> {
    match joined {
        Joined::Begins => None,
        Joined::Counted(Some(mut b)) => {
            let n = b.launches();
            *n = n.saturating_sub(1);
            if open.iter().any(|o| o.stream() == stream) {
                return Some(b);
            }
            open.push(b);
            None
        }
        Joined::Counted(None) => {
            if let Some(o) = open.iter_mut().find(|o| o.stream() == stream) {
                let n = o.launches();
                *n = n.saturating_sub(1);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    struct B(StreamKey, usize, u32);

    impl OpenBatch for B {
        fn stream(&self) -> (StreamKey, usize) {
            (self.0, self.1)
        }
        fn launches(&mut self) -> &mut u32 {
            &mut self.2
        }
    }

    const S: StreamKey = StreamKey::Handle(0x100);
    const T: StreamKey = StreamKey::Handle(0x200);

    #[test]
    fn a_launch_begins_a_batch_only_where_none_is_open() {
        let mut open = vec![B(T, 1, 3)];
        assert_eq!(join(&mut open, (S, 1), 16), Joined::Begins);
        // The same handle in another context is another stream.
        assert_eq!(join(&mut open, (T, 2), 16), Joined::Begins);
        assert_eq!(open, vec![B(T, 1, 3)], "nothing counted");
    }

    #[test]
    fn a_launch_is_counted_in_its_streams_open_batch_and_the_one_that_fills_it_takes_it_out() {
        let mut open = vec![B(T, 1, 3), B(S, 1, 14)];
        assert_eq!(join(&mut open, (S, 1), 16), Joined::Counted(None));
        assert_eq!(open[1], B(S, 1, 15));
        assert_eq!(
            join(&mut open, (S, 1), 16),
            Joined::Counted(Some(B(S, 1, 16)))
        );
        assert_eq!(open, vec![B(T, 1, 3)]);
        // The next launch on the stream begins the next batch.
        assert_eq!(join(&mut open, (S, 1), 16), Joined::Begins);
        // A batch whose length shrank meanwhile (shorter kernels measured) closes at once.
        assert_eq!(
            join(&mut open, (T, 1), 2),
            Joined::Counted(Some(B(T, 1, 4)))
        );
    }

    #[test]
    fn a_launch_that_goes_back_to_the_gate_is_counted_out() {
        let mut open = vec![B(S, 1, 5)];
        let j = join(&mut open, (S, 1), 16);
        assert_eq!(unjoin(&mut open, (S, 1), j), None);
        assert_eq!(open, vec![B(S, 1, 5)]);
        // One that filled the batch puts it back, less itself.
        let mut open = vec![B(S, 1, 15)];
        let j = join(&mut open, (S, 1), 16);
        assert!(open.is_empty());
        assert_eq!(unjoin(&mut open, (S, 1), j), None);
        assert_eq!(open, vec![B(S, 1, 15)]);
        // ...unless another launch began a batch there meanwhile: then it is closed as it is.
        let mut open = vec![B(S, 1, 15)];
        let j = join(&mut open, (S, 1), 16);
        open.push(B(S, 1, 1));
        assert_eq!(unjoin(&mut open, (S, 1), j), Some(B(S, 1, 15)));
        assert_eq!(open, vec![B(S, 1, 1)]);
        // A batch closed meanwhile (the scheduler thread's idle close): nothing to count out.
        let mut open = vec![B(S, 1, 5)];
        let j = join(&mut open, (S, 1), 16);
        open.clear();
        assert_eq!(unjoin(&mut open, (S, 1), j), None);
        assert!(open.is_empty());
        assert_eq!(unjoin(&mut open, (S, 1), Joined::<B>::Begins), None);
    }
}
