//! A call's inbound audio: carrier chunks → weir frames. Each `media` chunk is checked
//! (length against the call's format), put through the reorder window by its
//! `media.chunk` number, then — in order — decoded and resampled to 16 kHz and cut into
//! 20 ms frames (640 bytes). A chunk the window gave up on becomes a declared loss of
//! the frames it would have made; the decoder's history is reset there, so no audio is
//! smeared across the hole.
//!
//! Invariants: output is strictly in chunk order (a late chunk is dropped and counted,
//! its slot already declared); every chunk number from the first to the last is either
//! decoded or inside a declared loss, exactly once; nothing here allocates per chunk
//! beyond the frame it makes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_audio_telephony::codec::{self, Decoder, MediaFormat};
use weir_audio_telephony::dialect::Media;
use weir_audio_telephony::reorder::{Out, Pushed, Reorder, ReorderConfig};

use crate::door::{BadInput, frame_bytes};
use crate::metrics as m;
use weir_protocol::audio::FRAME_SAMPLES;

/// The chunk duration the window is counted in (both carriers send 20 ms chunks).
const CHUNK: Duration = Duration::from_millis(20);
/// A chunk further ahead than this (5 s) is refused (`sequence_jump`).
const MAX_JUMP_CHUNKS: u64 = 250;
/// How far behind a late chunk is still told apart from a stream gone backwards.
const HISTORY_CHUNKS: u64 = 64;

/// What the door pushes next, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    /// One frame of 16 kHz s16le PCM (640 bytes; shorter only as the last of a run
    /// that ended in a partial frame).
    Frame(Bytes),
    /// Audio that never arrived (or came too late): declared with reason `source`.
    Lost {
        /// Frames (seqs) it takes.
        frames: u64,
        /// Samples at 16 kHz.
        samples: u64,
    },
}

/// One call's inbound path.
pub struct InboundAudio {
    format: MediaFormat,
    reorder: Reorder<Bytes>,
    decoder: Decoder,
    /// Decoded samples not yet cut into a frame.
    pcm: Vec<i16>,
    /// 16 kHz samples of the last chunk decoded: the size a missing chunk is counted at.
    chunk_samples: u64,
    ready: VecDeque<Ready>,
}

impl InboundAudio {
    /// The path of a call in `format` with a reorder window of `window` (0: a missing
    /// chunk is declared as soon as a later one arrives). The window is counted in
    /// chunks — a missing chunk is declared when the chunk `window / 20 ms` after it
    /// arrives, whatever the arrival times' jitter — and a held chunk waits at most
    /// twice the window in wall time, for a stream that pauses behind a hole.
    pub fn new(format: MediaFormat, window: Duration) -> Self {
        let chunks = window.as_millis().div_ceil(CHUNK.as_millis()).max(1) as u64;
        Self {
            format,
            reorder: Reorder::new(ReorderConfig {
                window: chunks,
                hold: window * 2,
                max_jump: MAX_JUMP_CHUNKS,
                history: HISTORY_CHUNKS,
                first: Some(1),
            }),
            decoder: Decoder::new(format),
            pcm: Vec::with_capacity(2 * FRAME_SAMPLES),
            chunk_samples: (CHUNK.as_millis() as u64) * 16,
            ready: VecDeque::new(),
        }
    }

    /// Takes one inbound `media` chunk: checked, then into the window; what is ready
    /// now waits in [`Self::next_ready`].
    pub fn accept(&mut self, media: Media, now: Instant) -> Result<(), BadInput> {
        self.check_length(media.payload.len())?;
        match self
            .reorder
            .push(media.chunk, Bytes::from(media.payload), now)
        {
            Ok(Pushed::Held) => {}
            Ok(Pushed::Late) => {
                metrics::counter!(m::TELEPHONY_CHUNKS_TOTAL, m::LABEL_OUTCOME => "late")
                    .increment(1);
            }
            Err(e) => return Err(BadInput::policy(e.code(), e.to_string())),
        }
        self.release(now)
    }

    /// Releases what the window lets go of by `now` (a held chunk that waited out the
    /// window).
    pub fn release(&mut self, now: Instant) -> Result<(), BadInput> {
        while let Some(out) = self.reorder.pop(now) {
            self.take(out)?;
        }
        Ok(())
    }

    /// At the end of the call: everything held (with the gaps between), then the last
    /// partial frame.
    pub fn finish(&mut self) -> Result<(), BadInput> {
        let held: Vec<_> = self.reorder.finish().collect();
        for out in held {
            self.take(out)?;
        }
        self.flush_partial();
        Ok(())
    }

    /// When the window may next release something by time.
    pub fn deadline(&self) -> Option<Instant> {
        self.reorder.deadline()
    }

    /// The next frame or loss to push.
    pub fn next_ready(&mut self) -> Option<Ready> {
        self.ready.pop_front()
    }

    /// Chunks put back in order, and late ones, so far.
    pub fn reordered(&self) -> u64 {
        self.reorder.stats().reordered
    }

    fn check_length(&self, len: usize) -> Result<(), BadInput> {
        let bps = self.format.bytes_per_sample();
        if len == 0 {
            return Err(BadInput::policy("empty_payload", "media.payload is empty"));
        }
        if !len.is_multiple_of(bps) {
            return Err(BadInput::policy(
                "partial_sample",
                format!("media.payload is {len} bytes, not whole {bps}-byte samples"),
            ));
        }
        // The decoder's own rule, so nothing it would refuse gets into the window.
        let spm = self.format.samples_per_ms();
        if len / bps > codec::MAX_CHUNK_MS * spm {
            return Err(BadInput::policy(
                "payload_too_long",
                format!(
                    "media.payload holds {} ms of audio; at most {} ms",
                    (len / bps).div_ceil(spm),
                    codec::MAX_CHUNK_MS
                ),
            ));
        }
        Ok(())
    }

    fn take(&mut self, out: Out<Bytes>) -> Result<(), BadInput> {
        match out {
            Out::Chunk { item, .. } => {
                let before = self.pcm.len();
                self.decoder
                    .decode(&item, &mut self.pcm)
                    .map_err(|e| BadInput::policy(e.code(), e.to_string()))?;
                self.chunk_samples = (self.pcm.len() - before) as u64;
                while self.pcm.len() >= FRAME_SAMPLES {
                    let frame = frame_bytes(&self.pcm[..FRAME_SAMPLES]);
                    self.pcm.drain(..FRAME_SAMPLES);
                    self.ready.push_back(Ready::Frame(frame));
                }
            }
            Out::Gap { chunks, .. } => {
                // The audio before the hole keeps its own (short) frame; the filter
                // starts afresh after it.
                self.flush_partial();
                self.decoder.reset();
                let samples = chunks.saturating_mul(self.chunk_samples);
                let frames = samples.div_ceil(FRAME_SAMPLES as u64).max(1);
                metrics::counter!(m::TELEPHONY_GAPS_TOTAL).increment(1);
                metrics::counter!(m::TELEPHONY_GAP_CHUNKS_TOTAL).increment(chunks);
                self.ready.push_back(Ready::Lost { frames, samples });
            }
        }
        Ok(())
    }

    fn flush_partial(&mut self) {
        if !self.pcm.is_empty() {
            let frame = frame_bytes(&self.pcm);
            self.pcm.clear();
            self.ready.push_back(Ready::Frame(frame));
        }
    }
}
