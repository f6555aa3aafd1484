//! Latency percentiles over recorded samples (nearest-rank).

/// Nearest-rank percentile `p` (0..=100) of `sorted` samples; 0 for no samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    assert!((0.0..=100.0).contains(&p), "percentile {p} outside 0..=100");
    if sorted.is_empty() {
        return 0;
    }
    debug_assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "samples must be sorted");
    // p * n / 100 in floating point can land a hair above an integer (99.9% of 1000).
    let rank = (p * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of unsorted values (for repeated runs).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_of_one_to_a_thousand() {
        let samples: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&samples, 50.0), 500);
        assert_eq!(percentile(&samples, 99.0), 990);
        assert_eq!(percentile(&samples, 99.9), 999);
        assert_eq!(percentile(&samples, 100.0), 1000);
        assert_eq!(percentile(&samples, 0.0), 1);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
