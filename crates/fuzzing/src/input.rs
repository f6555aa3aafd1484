//! [`Input`]: reads configuration values off the front of a fuzz input.

/// A cursor over fuzz bytes. Reads past the end give zeros (and empty slices), so any input,
/// the empty one included, decodes to some configuration: the fuzzer never wastes an execution
/// on a rejected input, and a seed only has to write the values it cares about.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn u8(&mut self) -> u8 {
        let (&first, rest) = self.data.split_first().unwrap_or((&0, &[]));
        self.data = rest;
        first
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// The next `len` bytes (fewer when the input ends first).
    pub fn bytes(&mut self, len: usize) -> &'a [u8] {
        let (taken, rest) = self.data.split_at(len.min(self.data.len()));
        self.data = rest;
        taken
    }

    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_are_zeros() {
        let mut input = Input::new(&[1, 2, 3]);
        assert_eq!(input.u16(), 0x0201);
        assert_eq!(input.u32(), 3);
        assert_eq!(input.bytes(4), &[] as &[u8]);
        assert!(input.is_empty());
        assert_eq!(Input::new(&[9, 8, 7]).bytes(2), &[9, 8]);
    }
}
