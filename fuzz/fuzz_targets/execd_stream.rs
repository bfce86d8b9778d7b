//! The OpenSandbox execd event-stream parser (SSE `data:` frames or bare JSON lines) reads
//! bytes a backend sends: it must never panic, and how the bytes are split into chunks by the
//! network must not change what it reads.
#![no_main]

use differently_adapters::opensandbox::{ExecdEvent, FrameError, FrameParser};
use libfuzzer_sys::fuzz_target;

/// Feeds `chunks` one after another, then ends the stream; stops at the first error.
fn parse<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> Result<Vec<ExecdEvent>, FrameError> {
    let mut p = FrameParser::default();
    let mut events = Vec::new();
    for c in chunks {
        events.extend(p.push(c)?);
    }
    events.extend(p.finish()?);
    Ok(events)
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks a chunk size (1..=64) to split the rest into.
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let whole = parse(std::iter::once(stream));
    let split = parse(stream.chunks(usize::from(size % 64) + 1));
    match (&whole, &split) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the chunking changed the events read"),
        (Err(_), Err(_)) => {}
        _ => panic!("the chunking changed whether the stream parses: {whole:?} vs {split:?}"),
    }
});
