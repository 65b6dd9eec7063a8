//! Segment images on the server's flash directory: the store's [`FlashImages`] over a
//! [`FlashDevice`] (files, one per image, with direct I/O where the file system allows it).
//!
//! An image is this process's own cache of a segment whose objects moved to flash; the durable
//! copies are the segment's replicas on backups. So an image is never synced, and a new process
//! deletes every image it finds (its log starts empty; a restarted server gets its data back
//! through recovery, docs/design/flash-tier.md).

use std::path::Path;
use std::sync::Arc;

use stratus_flash::aligned::{align_down, align_up, AlignedBuffer};
use stratus_flash::{FileDevice, FlashDevice, FlashError, IoMode, SegmentNumber};
use stratus_store::{FlashImageError, FlashImages};
use stratus_types::SegmentId;

/// Images on a flash device; see the module documentation.
#[derive(Debug)]
pub struct DeviceImages {
    device: Arc<dyn FlashDevice>,
}

fn image_error(error: FlashError) -> FlashImageError {
    match error {
        FlashError::Full { .. } => FlashImageError::Full,
        FlashError::Io { kind, .. } => FlashImageError::Io(kind),
        _ => FlashImageError::Io(std::io::ErrorKind::Other),
    }
}

impl DeviceImages {
    /// Images in `directory`, at most `budget_bytes` of them, each at most `segment_bytes` (the
    /// log's segment size). Images an earlier process left are deleted.
    pub fn open(
        directory: &Path,
        segment_bytes: u64,
        budget_bytes: u64,
    ) -> Result<(DeviceImages, IoMode), FlashError> {
        let device = FileDevice::open(directory, segment_bytes, budget_bytes)?;
        let mode = device.io_mode();
        let images = DeviceImages::on(Arc::new(device))?;
        Ok((images, mode))
    }

    /// Images on `device` (tests use a memory device); images already there are deleted.
    pub fn on(device: Arc<dyn FlashDevice>) -> Result<DeviceImages, FlashError> {
        for segment in device.segments()? {
            device.free(segment)?;
        }
        Ok(DeviceImages { device })
    }
}

impl FlashImages for DeviceImages {
    fn write_image(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), FlashImageError> {
        let number = SegmentNumber(segment.0);
        self.device.allocate(number).map_err(image_error)?;
        // Direct I/O writes whole aligned blocks from an aligned buffer: the tail is padded
        // with zeros, which the image's certificate (its length) excludes.
        let mut buffer = AlignedBuffer::zeroed(align_up(bytes.len() as u64) as usize);
        buffer.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        let written = self.device.write_at(number, 0, buffer.as_slice());
        if let Err(error) = written {
            // Nothing refers to a half-written image: give its space back.
            let _ = self.device.free(number);
            return Err(image_error(error));
        }
        Ok(())
    }

    fn read(
        &self,
        segment: SegmentId,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, FlashImageError> {
        let start = align_down(u64::from(offset));
        let end = align_up(u64::from(offset) + u64::from(length));
        let mut buffer = AlignedBuffer::zeroed((end - start) as usize);
        let present = self
            .device
            .read_at(SegmentNumber(segment.0), start, buffer.as_mut_slice())
            .map_err(|error| match error {
            FlashError::Io { kind: std::io::ErrorKind::NotFound, .. } => {
                FlashImageError::Missing(segment)
            }
            other => image_error(other),
        })?;
        let skip = (u64::from(offset) - start) as usize;
        if present < skip + length as usize {
            return Err(FlashImageError::ShortRead);
        }
        Ok(buffer.as_slice()[skip..skip + length as usize].to_vec())
    }

    fn delete_image(&self, segment: SegmentId) {
        if let Err(error) = self.device.free(SegmentNumber(segment.0)) {
            // Its space stays counted until a restart deletes it; nothing reads it any more.
            tracing::warn!(%segment, ?error, "could not delete a segment image");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_flash::MemoryDevice;

    #[test]
    fn an_image_reads_back_at_any_offset_and_is_gone_once_deleted() {
        let device = Arc::new(MemoryDevice::new(1 << 20, 4 << 20));
        let images = DeviceImages::on(device.clone()).unwrap();
        let bytes: Vec<u8> = (0..10_000u32).map(|index| (index * 7) as u8).collect();
        images.write_image(SegmentId(3), &bytes).unwrap();
        for (offset, length) in [(0u32, 1u32), (4095, 2), (5000, 4999), (9_999, 1), (0, 10_000)] {
            let read = images.read(SegmentId(3), offset, length).unwrap();
            assert_eq!(read, bytes[offset as usize..(offset + length) as usize]);
        }
        // Past the image's end to its block's end: the padding (the store never asks for it:
        // its locators lie within the image's certificate).
        assert_eq!(images.read(SegmentId(3), 9_999, 100).unwrap()[1..], [0; 99]);
        images.delete_image(SegmentId(3));
        assert!(images.read(SegmentId(3), 0, 1).is_err());
    }

    #[test]
    fn a_full_device_refuses_an_image_and_a_new_process_starts_empty() {
        let device = Arc::new(MemoryDevice::new(1 << 20, 2 << 20));
        let images = DeviceImages::on(device.clone()).unwrap();
        images.write_image(SegmentId(1), &[1; 100]).unwrap();
        images.write_image(SegmentId(2), &[2; 100]).unwrap();
        assert_eq!(images.write_image(SegmentId(3), &[3; 100]), Err(FlashImageError::Full));
        drop(images);
        let reopened = DeviceImages::on(device.clone()).unwrap();
        assert!(device.segments().unwrap().is_empty());
        reopened.write_image(SegmentId(3), &[3; 100]).unwrap();
    }
}
