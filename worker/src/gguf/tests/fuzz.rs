//! Random mutations of a valid file never panic the reader.

use super::*;

/// One random mutation of `b`: flip bytes, truncate, or splice an extreme
/// or small integer over a random window (counts and lengths live there).
fn mutate(rng: &mut ChaCha8Rng, b: &mut Vec<u8>) {
    if b.is_empty() {
        return;
    }
    match rng.random_range(0..5) {
        0 => {
            for _ in 0..rng.random_range(1..=4) {
                let i = rng.random_range(0..b.len());
                b[i] ^= rng.random_range(1..=255u8);
            }
        }
        1 => {
            let len = rng.random_range(0..b.len());
            b.truncate(len);
        }
        k => {
            let value: u64 = match k {
                2 => u64::MAX,
                3 => rng.random_range(0..=64),
                _ => rng.random(),
            };
            let bytes = value.to_le_bytes();
            let n = bytes.len().min(b.len());
            let i = rng.random_range(0..=b.len() - n);
            b[i..i + n].copy_from_slice(&bytes[..n]);
        }
    }
}

#[test]
fn fuzz_mutations_never_panic() {
    let base = sample_writer().to_bytes();
    let mut rng = ChaCha8Rng::seed_from_u64(0x6767_7566);
    let (mut ok, mut err) = (0u32, 0u32);
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..rng.random_range(1..=3) {
            mutate(&mut rng, &mut b);
        }
        match parse(b) {
            Ok(f) => {
                ok += 1;
                // Whatever passed validation must be safe to slice.
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                }
            }
            Err(e) => {
                err += 1;
                let _ = e.to_string();
            }
        }
    }
    eprintln!("fuzz: {ok} parsed, {err} refused");
    assert!(
        ok > 0 && err > 0,
        "mutations should both keep and break files"
    );
}
