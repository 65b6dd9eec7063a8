//! A synchronous wrapper around [`Client`] for code without an async runtime.

use bytes::Bytes;
use stratus_types::{RejectRules, TableId, Version};
use stratus_wire::{EnumeratedObject, IncrementItem, KeyItem, ServerEntry, TableEntry, WriteItem};

use crate::client::{Client, ClientConfig};
use crate::error::{Error, Result};

/// A blocking client: owns a small tokio runtime and runs each call to completion on it.
#[derive(Debug)]
pub struct BlockingClient {
    runtime: tokio::runtime::Runtime,
    client: Client,
}

impl BlockingClient {
    /// A blocking client of the cluster described by `config`.
    pub fn new(config: ClientConfig) -> Result<BlockingClient> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| Error::new(stratus_wire::Status::InternalError, error.to_string()))?;
        let client = {
            let _guard = runtime.enter();
            Client::new(config)
        };
        Ok(BlockingClient { runtime, client })
    }

    /// The async client inside.
    pub fn async_client(&self) -> &Client {
        &self.client
    }

    /// See [`Client::create_table`].
    pub fn create_table(&self, name: &str, server_span: u32) -> Result<TableId> {
        self.runtime.block_on(self.client.create_table(name, server_span))
    }

    /// See [`Client::drop_table`].
    pub fn drop_table(&self, name: &str) -> Result<()> {
        self.runtime.block_on(self.client.drop_table(name))
    }

    /// See [`Client::get_table_id`].
    pub fn get_table_id(&self, name: &str) -> Result<TableId> {
        self.runtime.block_on(self.client.get_table_id(name))
    }

    /// See [`Client::list_tables`].
    pub fn list_tables(&self) -> Result<Vec<TableEntry>> {
        self.runtime.block_on(self.client.list_tables())
    }

    /// See [`Client::server_list`].
    pub fn server_list(&self) -> Result<Vec<ServerEntry>> {
        self.runtime.block_on(self.client.server_list())
    }

    /// See [`Client::read_with`].
    pub fn read(
        &self,
        table_id: TableId,
        key: &[u8],
        rules: RejectRules,
    ) -> Result<(Bytes, Version)> {
        self.runtime.block_on(self.client.read_with(table_id, key, rules))
    }

    /// See [`Client::write_with`].
    pub fn write(
        &self,
        table_id: TableId,
        key: &[u8],
        value: &[u8],
        rules: RejectRules,
    ) -> Result<Version> {
        self.runtime.block_on(self.client.write_with(
            table_id,
            key,
            Bytes::copy_from_slice(value),
            rules,
        ))
    }

    /// See [`Client::remove_with`].
    pub fn remove(&self, table_id: TableId, key: &[u8], rules: RejectRules) -> Result<Version> {
        self.runtime.block_on(self.client.remove_with(table_id, key, rules))
    }

    /// See [`Client::increment_with`].
    pub fn increment(
        &self,
        table_id: TableId,
        key: &[u8],
        delta: i64,
        rules: RejectRules,
    ) -> Result<(i64, Version)> {
        self.runtime.block_on(self.client.increment_with(table_id, key, delta, rules))
    }

    /// See [`Client::multi_read`].
    pub fn multi_read(&self, items: &[KeyItem]) -> Vec<Result<(Bytes, Version)>> {
        self.runtime.block_on(self.client.multi_read(items))
    }

    /// See [`Client::multi_write`].
    pub fn multi_write(&self, items: &[WriteItem]) -> Vec<Result<Version>> {
        self.runtime.block_on(self.client.multi_write(items))
    }

    /// See [`Client::multi_remove`].
    pub fn multi_remove(&self, items: &[KeyItem]) -> Vec<Result<Version>> {
        self.runtime.block_on(self.client.multi_remove(items))
    }

    /// See [`Client::multi_increment`].
    pub fn multi_increment(&self, items: &[IncrementItem]) -> Vec<Result<(i64, Version)>> {
        self.runtime.block_on(self.client.multi_increment(items))
    }

    /// Every object of a table (see [`Client::enumerate`]).
    pub fn enumerate_all(&self, table_id: TableId) -> Result<Vec<EnumeratedObject>> {
        self.runtime.block_on(self.client.enumerate(table_id).collect_all())
    }
}
