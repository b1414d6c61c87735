//! The open sequences of a backend: a fixed number of slots, each with the
//! backend's own per-sequence state, handed out as [`SeqId`]s.
//!
//! A handle names its slot and the serial number of the sequence opened in
//! it, so a handle kept after its sequence closed never reaches the next
//! sequence of the same slot: every call with it is a caller bug.

use crate::backend::BackendError;

/// An open sequence of a backend ([`crate::backend::Backend::open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId {
    slot: u32,
    serial: u32,
}

impl SeqId {
    /// The slot the sequence holds (below the backend's `max_sequences`).
    pub fn slot(self) -> usize {
        self.slot as usize
    }
}

/// `n` slots of per-sequence state `S`, each free or holding one open
/// sequence. The state stays with its slot between sequences (a device
/// buffer made once); the backend resets what a new sequence needs.
pub struct Slots<S> {
    slots: Vec<Slot<S>>,
    next_serial: u32,
}

struct Slot<S> {
    /// The serial number of the sequence open in this slot.
    open: Option<u32>,
    state: S,
}

impl<S> Slots<S> {
    /// `states.len()` free slots.
    pub fn new(states: Vec<S>) -> Self {
        Slots {
            slots: states
                .into_iter()
                .map(|state| Slot { open: None, state })
                .collect(),
            next_serial: 0,
        }
    }

    /// How many sequences may be open at once.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// How many are open now.
    pub fn open_count(&self) -> usize {
        self.slots.iter().filter(|s| s.open.is_some()).count()
    }

    pub fn any_open(&self) -> bool {
        self.slots.iter().any(|s| s.open.is_some())
    }

    /// Keeps the first `n` slots and makes more with `make` (only while none
    /// is open, so that no handle outlives its slot).
    pub fn resize(
        &mut self,
        n: usize,
        mut make: impl FnMut() -> Result<S, BackendError>,
    ) -> Result<(), BackendError> {
        if n == 0 {
            return Err(BackendError::CallerBug("zero sequences".into()));
        }
        if self.any_open() {
            return Err(BackendError::CallerBug(
                "the number of sequences changes only while none is open".into(),
            ));
        }
        self.slots.truncate(n);
        while self.slots.len() < n {
            self.slots.push(Slot {
                open: None,
                state: make()?,
            });
        }
        Ok(())
    }

    /// Takes the lowest free slot for a new sequence: its handle and state.
    pub fn open(&mut self) -> Result<(SeqId, &mut S), BackendError> {
        let n = self.slots.len();
        let Some(slot) = self.slots.iter().position(|s| s.open.is_none()) else {
            return Err(BackendError::CallerBug(format!(
                "all {n} sequences are open: close one first"
            )));
        };
        let serial = self.next_serial;
        self.next_serial = self.next_serial.wrapping_add(1);
        let s = &mut self.slots[slot];
        s.open = Some(serial);
        let id = SeqId {
            slot: slot as u32,
            serial,
        };
        Ok((id, &mut s.state))
    }

    /// Frees `id`'s slot; its state, for the backend to clear, or `None`
    /// when `id` is not open.
    pub fn close(&mut self, id: SeqId) -> Option<&mut S> {
        let s = self.slots.get_mut(id.slot())?;
        if s.open != Some(id.serial) {
            return None;
        }
        s.open = None;
        Some(&mut s.state)
    }

    pub fn get(&self, id: SeqId) -> Result<&S, BackendError> {
        match self.slots.get(id.slot()) {
            Some(s) if s.open == Some(id.serial) => Ok(&s.state),
            _ => Err(not_open(id)),
        }
    }

    pub fn get_mut(&mut self, id: SeqId) -> Result<&mut S, BackendError> {
        match self.slots.get_mut(id.slot()) {
            Some(s) if s.open == Some(id.serial) => Ok(&mut s.state),
            _ => Err(not_open(id)),
        }
    }

    /// The states of `ids` (open and distinct), in their order.
    pub fn get_many_mut(&mut self, ids: &[SeqId]) -> Result<Vec<&mut S>, BackendError> {
        for id in ids {
            self.get(*id)?;
        }
        let mut free: Vec<Option<&mut Slot<S>>> = self.slots.iter_mut().map(Some).collect();
        ids.iter()
            .map(|id| {
                free[id.slot()]
                    .take()
                    .map(|s| &mut s.state)
                    .ok_or_else(|| BackendError::CallerBug(format!("{id:?} is twice in one step")))
            })
            .collect()
    }

    /// Every slot's state, open or not.
    pub fn states(&self) -> impl Iterator<Item = &S> {
        self.slots.iter().map(|s| &s.state)
    }

    /// Every slot's state, open or not.
    pub fn states_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.slots.iter_mut().map(|s| &mut s.state)
    }

    /// The open sequences' states.
    pub fn open_states(&self) -> impl Iterator<Item = &S> {
        self.slots
            .iter()
            .filter(|s| s.open.is_some())
            .map(|s| &s.state)
    }
}

fn not_open(id: SeqId) -> BackendError {
    BackendError::CallerBug(format!("{id:?} is not an open sequence"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Slots<u32> {
        Slots::new(vec![0, 0])
    }

    #[test]
    fn handles_name_one_sequence_and_go_stale_when_it_closes() {
        let mut s = two();
        let (a, _) = s.open().unwrap();
        let (b, _) = s.open().unwrap();
        assert_ne!(a.slot(), b.slot());
        assert!(s.open().is_err(), "both slots are taken");
        *s.get_mut(a).unwrap() = 7;
        assert_eq!(*s.close(a).unwrap(), 7);
        assert!(s.close(a).is_none(), "closed twice");
        let (c, _) = s.open().unwrap();
        assert_eq!(c.slot(), a.slot(), "the freed slot is taken again");
        assert!(
            s.get(a).is_err(),
            "a stale handle never reaches the new sequence"
        );
        assert!(s.get(c).is_ok());
        assert_eq!(s.open_count(), 2);
    }

    #[test]
    fn a_step_names_each_sequence_once() {
        let mut s = two();
        let (a, _) = s.open().unwrap();
        let (b, _) = s.open().unwrap();
        assert_eq!(s.get_many_mut(&[b, a]).unwrap().len(), 2);
        assert!(s.get_many_mut(&[a, a]).is_err());
    }

    #[test]
    fn resizing_waits_for_every_sequence_to_close() {
        let mut s = two();
        let (a, _) = s.open().unwrap();
        assert!(s.resize(4, || Ok(0)).is_err());
        s.close(a);
        s.resize(4, || Ok(0)).unwrap();
        assert_eq!(s.capacity(), 4);
        assert!(s.resize(0, || Ok(0)).is_err());
    }
}
