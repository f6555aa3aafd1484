//! Checksums as Linux computes them.
//!
//! JBD2 and ext4 use *raw* crc32c: Linux `crc32c(seed, data)` applies no final inversion and
//! takes the running value as the seed. The `crc32c` crate returns finalized CRCs, so
//! `raw(seed, data) == !crc32c_append(!seed, data)`.
//! JBD2 checksum v1 (compat CHECKSUM) uses `crc32_be`, the non-reflected CRC-32.

/// Linux-style raw crc32c (Castagnoli), continuing from `seed`.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

const CRC32_BE_POLY: u32 = 0x04C1_1DB7;

const fn crc32_be_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u32) << 24;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000_0000 != 0 { (crc << 1) ^ CRC32_BE_POLY } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

static CRC32_BE_TABLE: [u32; 256] = crc32_be_table();

/// Linux `crc32_be(seed, data)`: big-endian (MSB-first) CRC-32, no inversions.
pub fn crc32_be(seed: u32, data: &[u8]) -> u32 {
    data.iter()
        .fold(seed, |crc, &byte| (crc << 8) ^ CRC32_BE_TABLE[((crc >> 24) ^ byte as u32) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_raw_matches_linux_test_vector() {
        // crc32c("123456789") finalized is 0xE3069283; raw with seed ~0 is its inversion.
        assert_eq!(crc32c_raw(!0, b"123456789"), !0xE306_9283);
        // Chaining two halves equals one pass.
        assert_eq!(crc32c_raw(crc32c_raw(!0, b"1234"), b"56789"), crc32c_raw(!0, b"123456789"));
    }

    #[test]
    fn crc32_be_matches_known_vector() {
        // CRC-32/MPEG-2 (poly 0x04C11DB7, init ~0, no reflection, no xorout) of "123456789".
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
    }
}
