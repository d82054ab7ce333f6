//! An inert `wasi:filesystem`, written here so a reviewer can read all of it:
//! `get-directories` returns no preopens, and without a preopened directory a
//! component has no descriptor to start from: `descriptor` and
//! `directory-entry-stream` are never created, so no file can be named, read
//! or written. Every descriptor method (unreachable: the canonical ABI refuses
//! a handle that was never issued) answers `not-permitted` all the same.
//!
//! Python (componentize-py) and JavaScript (componentize-js) runtimes import
//! the filesystem whether or not a tool uses it; this lets them load without
//! granting anything. Nothing of wasmtime-wasi's real filesystem is linked.

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::{preopens, types};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, FsResult};

/// The host side of the inert filesystem: it holds nothing, so it can reach nothing.
pub struct InertFs;

impl HasData for InertFs {
    type Data<'a> = InertFs;
}

/// Links `wasi:filesystem/types` and `wasi:filesystem/preopens`, both inert, into `l`.
///
/// # Errors
/// The interfaces are already defined in the linker.
pub fn add_to_linker<T: Send + 'static>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    types::add_to_linker::<T, InertFs>(l, |_| InertFs)?;
    preopens::add_to_linker::<T, InertFs>(l, |_| InertFs)?;
    Ok(())
}

/// The answer to anything asked of a descriptor.
fn denied<T>() -> FsResult<T> {
    Err(types::ErrorCode::NotPermitted.into())
}

impl preopens::Host for InertFs {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        Ok(Vec::new())
    }
}

impl types::Host for InertFs {
    fn convert_error_code(&mut self, err: wasmtime_wasi::p2::FsError) -> wasmtime::Result<types::ErrorCode> {
        err.downcast()
    }

    fn filesystem_error_code(&mut self, _err: Resource<wasmtime::Error>) -> wasmtime::Result<Option<types::ErrorCode>> {
        Ok(None)
    }
}

type Fd = Resource<Descriptor>;

impl types::HostDescriptor for InertFs {
    async fn advise(&mut self, _: Fd, _: u64, _: u64, _: types::Advice) -> FsResult<()> {
        denied()
    }
    async fn sync_data(&mut self, _: Fd) -> FsResult<()> {
        denied()
    }
    async fn get_flags(&mut self, _: Fd) -> FsResult<types::DescriptorFlags> {
        denied()
    }
    async fn get_type(&mut self, _: Fd) -> FsResult<types::DescriptorType> {
        denied()
    }
    async fn set_size(&mut self, _: Fd, _: u64) -> FsResult<()> {
        denied()
    }
    async fn set_times(&mut self, _: Fd, _: types::NewTimestamp, _: types::NewTimestamp) -> FsResult<()> {
        denied()
    }
    async fn read(&mut self, _: Fd, _: u64, _: u64) -> FsResult<(Vec<u8>, bool)> {
        denied()
    }
    async fn write(&mut self, _: Fd, _: Vec<u8>, _: u64) -> FsResult<u64> {
        denied()
    }
    async fn read_directory(&mut self, _: Fd) -> FsResult<Resource<types::DirectoryEntryStream>> {
        denied()
    }
    async fn sync(&mut self, _: Fd) -> FsResult<()> {
        denied()
    }
    async fn create_directory_at(&mut self, _: Fd, _: String) -> FsResult<()> {
        denied()
    }
    async fn stat(&mut self, _: Fd) -> FsResult<types::DescriptorStat> {
        denied()
    }
    async fn stat_at(&mut self, _: Fd, _: types::PathFlags, _: String) -> FsResult<types::DescriptorStat> {
        denied()
    }
    async fn set_times_at(&mut self, _: Fd, _: types::PathFlags, _: String, _: types::NewTimestamp, _: types::NewTimestamp) -> FsResult<()> {
        denied()
    }
    async fn link_at(&mut self, _: Fd, _: types::PathFlags, _: String, _: Fd, _: String) -> FsResult<()> {
        denied()
    }
    async fn open_at(&mut self, _: Fd, _: types::PathFlags, _: String, _: types::OpenFlags, _: types::DescriptorFlags) -> FsResult<Fd> {
        denied()
    }
    fn drop(&mut self, _: Fd) -> wasmtime::Result<()> {
        Ok(())
    }
    async fn readlink_at(&mut self, _: Fd, _: String) -> FsResult<String> {
        denied()
    }
    async fn remove_directory_at(&mut self, _: Fd, _: String) -> FsResult<()> {
        denied()
    }
    async fn rename_at(&mut self, _: Fd, _: String, _: Fd, _: String) -> FsResult<()> {
        denied()
    }
    async fn symlink_at(&mut self, _: Fd, _: String, _: String) -> FsResult<()> {
        denied()
    }
    async fn unlink_file_at(&mut self, _: Fd, _: String) -> FsResult<()> {
        denied()
    }
    fn read_via_stream(&mut self, _: Fd, _: u64) -> FsResult<Resource<DynInputStream>> {
        denied()
    }
    fn write_via_stream(&mut self, _: Fd, _: u64) -> FsResult<Resource<DynOutputStream>> {
        denied()
    }
    fn append_via_stream(&mut self, _: Fd) -> FsResult<Resource<DynOutputStream>> {
        denied()
    }
    async fn is_same_object(&mut self, _: Fd, _: Fd) -> wasmtime::Result<bool> {
        Ok(false)
    }
    async fn metadata_hash(&mut self, _: Fd) -> FsResult<types::MetadataHashValue> {
        denied()
    }
    async fn metadata_hash_at(&mut self, _: Fd, _: types::PathFlags, _: String) -> FsResult<types::MetadataHashValue> {
        denied()
    }
}

impl types::HostDirectoryEntryStream for InertFs {
    async fn read_directory_entry(&mut self, _: Resource<types::DirectoryEntryStream>) -> FsResult<Option<types::DirectoryEntry>> {
        denied()
    }
    fn drop(&mut self, _: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        Ok(())
    }
}
