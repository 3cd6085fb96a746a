/* stitch/stitch.h — the C API of libstitch. Valid C99; needs no CUDA header.
 *
 * A stream is a cudaStream_t passed as void* (NULL is the default stream). No function throws:
 * failures return NULL or a non-zero code and stitch_last_error() says why (until the next
 * failure or stitch_clear_error()). The process-wide
 * allocator is created at first use from STITCH_ALLOC_CONF plus any stitch_configure() calls
 * made before it. stitch_malloc/stitch_free have the signatures PyTorch's
 * torch.cuda.memory.CUDAPluggableAllocator expects. */
#ifndef STITCH_STITCH_H
#define STITCH_STITCH_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define STITCH_API __declspec(dllexport)
#else
#define STITCH_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Allocates `size` bytes on `device` for `stream`; 512-byte aligned. Returns NULL for size 0
 *  (no error) and on failure (out of memory: num_ooms counts it and stitch_last_error() holds the
 *  report). PyTorch's alloc hook. */
STITCH_API void* stitch_malloc(size_t size, int device, void* stream);
/** Frees `ptr` (size and device as allocated). NULL does nothing. An unknown pointer, a double
 *  free or a wrong size/device changes nothing, counts num_invalid_frees and sets the error
 *  (or aborts with on_invalid_free:abort). PyTorch's free hook. */
STITCH_API void stitch_free(void* ptr, size_t size, int device, void* stream);
/** Applies a `key:value,...` configuration. 0 on success. Before the first allocation any key may
 *  be set; afterwards only tunables (not backend, sim_capacity_mb, sim_devices). */
STITCH_API int stitch_configure(const char* conf);
/** Marks `ptr` as used on `stream` (see Tensor.record_stream). 0 on success. */
STITCH_API int stitch_record_stream(void* ptr, void* stream);
/** Pins the live allocation at `ptr`: until as many stitch_unpin() calls, the physical memory
 *  under it never moves (stitch_compact leaves its whole page alone), for memory registered with a
 *  NIC (GPUDirect RDMA) or NCCL, or exported. 0 on success; an unknown pointer, or an unpin
 *  without a pin, fails. */
STITCH_API int stitch_pin(void* ptr);
STITCH_API int stitch_unpin(void* ptr);
/** Returns cached, entirely free segments of `device` (-1: every device) to the device. */
STITCH_API int stitch_empty_cache(int device);
/** Gives back cached free memory of `device` (-1: every device) until its reserved memory is at
 *  most `keep_bytes` or nothing more can go (an empty_cache that stops when enough has gone).
 *  0 on success. */
STITCH_API int stitch_trim(int device, size_t keep_bytes);

/* ---- region tags, sleep and wake (docs/sleep.md) ------------------------------------------- */
/** stitch_region_begin's flags (a bit set). */
#define STITCH_REGION_BACKUP 1 /* live blocks allocated in the region are kept over a sleep */
#define STITCH_REGION_SPILL 2  /* the tag's memory may move to host pages (docs/spill.md) */
/** Opens a region on the calling thread: until its stitch_region_end(), the thread's
 *  allocations, on every device, carry `tag` (regions nest; the innermost wins; other threads are
 *  not affected). Tagged memory lies in expandable ranges of its own, whatever the configuration
 *  says, and its pages never serve another tag. `flags`: STITCH_REGION_BACKUP: the live blocks
 *  allocated in this region are copied to host memory at every sleep and back at the wake (per
 *  allocation, as before: 0 and 1 mean what they always did); STITCH_REGION_SPILL: the tag's
 *  memory may move to host pages (stitch_spill, spill:tags) — once any region opened the tag with
 *  it, the whole tag may spill, whichever region allocated its blocks. 0 on success; an empty
 *  tag, one with a comma, or other flag bits fail. */
STITCH_API int stitch_region_begin(const char* tag, int flags);
/** Closes the calling thread's innermost region; fails when none is open. */
STITCH_API int stitch_region_end(void);
/** Puts the tags in `tags` (comma-separated; NULL: every tag) to sleep on `device` (-1: every
 *  device): synchronizes the device and its peers, copies the live blocks of regions with backup
 *  and of the tags in `backup_tags` (comma-separated; NULL: none more) to pinned host memory —
 *  what the host (or backup_host_mb) does not take goes to files of backup_dir — then unmaps
 *  every page of the tags' ranges and gives its physical memory back to the device. The
 *  addresses stay reserved; other blocks' contents are lost. A tag asleep already is left alone.
 *  Fails for a tag never used, while a graph is being captured on the device, or when the host
 *  and the backup files cannot hold the backups (or a file cannot be written: the error names it
 *  and the offset); each device is all or nothing (what was written is removed) and the error
 *  says which devices sleep. 0 on success. */
STITCH_API int stitch_sleep(int device, const char* tags, const char* backup_tags);
/** Wakes the tags in `tags` (NULL: every sleeping tag) on `device` (-1: every device): fresh
 *  physical memory at the same addresses, the backups copied back, their host memory freed and
 *  their files closed. When the device cannot give the memory, fails with the out-of-memory
 *  report, and when a backup file cannot be read, with an error naming it, the offset and the
 *  size; either way nothing changes on that device: the tags stay asleep with their backups,
 *  and the wake may be retried. 0 on success. */
STITCH_API int stitch_wake(int device, const char* tags);
/** How far the stitch_sleep or stitch_wake running on `device` is, for another thread to show
 *  (the call itself holds the device): the bytes of backups copied out or back so far in *done
 *  and of how many in *total (either may be NULL). Returns 1 while a sleep runs, 2 while a wake
 *  runs, 0 when neither does, -1 for a bad device (stitch_last_error). */
STITCH_API int stitch_backup_progress(int device, uint64_t* done, uint64_t* total);
/* ---- spill to host pages (docs/spill.md) ---------------------------------------------------- */
/** Moves the live memory of `tags` (comma-separated; NULL: every tag opened with
 *  STITCH_REGION_SPILL) on `device` (-1: every device) to host pages mapped under the same
 *  addresses (kernels keep using them, over the bus), at least `bytes` of it per device (0: all),
 *  coldest tag first; the free device pages of their ranges go back to the device. Pinned and
 *  exported blocks stay. All or nothing per device: when the host (or spill_limit_mb) cannot take
 *  it, it fails and nothing changes there. Fails for a tag never used or not opened with
 *  STITCH_REGION_SPILL (the error names it), while a graph is captured, and where the back end
 *  has no host pages. Synchronizes the device and its peers first. 0 on success. */
STITCH_API int stitch_spill(int device, const char* tags, size_t bytes);
/** Brings the spilled memory of `tags` (NULL: everything spilled, untagged memory too) on
 *  `device` (-1: every device) back to device pages, range by range; like a wake, it releases
 *  cached free memory before it gives up. 0 when everything is back; otherwise an out-of-memory
 *  error naming what stays on the host (still usable at its address). */
STITCH_API int stitch_unspill(int device, const char* tags);
/* ---- an elastic paged KV cache (docs/kv.md) ---------------------------------------------------- */
typedef struct stitch_kv_pool stitch_kv_pool;
/** `buffers` virtual ranges (K and V of every layer), each max_blocks * block_bytes long, all
 *  tagged `tag` (NULL: "kv"). Block i lives at base(b) + i * block_bytes in every buffer b; its
 *  pages are mapped in every buffer at once. `flags`: STITCH_REGION_BACKUP (live blocks survive
 *  the tag's sleep), STITCH_REGION_SPILL. Pages are kv_page_mb (2 MiB) rounded to the device's
 *  granularity. Needs the virtual-memory API. NULL on error (stitch_last_error). */
STITCH_API stitch_kv_pool* stitch_kv_create(int device, int buffers, size_t block_bytes, size_t max_blocks,
                                            const char* tag, unsigned flags);
/** Base address of buffer `buffer`; NULL and an error for a bad pool or buffer. */
STITCH_API void* stitch_kv_buffer(stitch_kv_pool* pool, int buffer);
/** `n` block ids into `ids`, lowest free first; maps the pages they need (never synchronizes
 *  while the device has room; short of memory it climbs stitch's out-of-memory ladder, which
 *  takes the cache and every pool's unused pages). 0, or an error with nothing allocated (the
 *  limit, the device out of memory, or the pool's tag asleep). */
STITCH_API int stitch_kv_alloc(stitch_kv_pool* pool, size_t n, int64_t* ids);
/** Frees `n` ids: never waits, never unmaps (the pages stay mapped until a trim). An id out of
 *  range, not allocated, or listed twice: an error, nothing freed. */
STITCH_API int stitch_kv_free(stitch_kv_pool* pool, const int64_t* ids, size_t n);
/** Bytes of pages under live blocks the pool may hold (0: no limit); below what it holds now,
 *  allocations fail until frees bring it under, and a trim releases down to it. */
STITCH_API int stitch_kv_set_limit(stitch_kv_pool* pool, size_t bytes);
/** Blocks allocatable now, within the limit and the device's room (0 on error). */
STITCH_API size_t stitch_kv_available(stitch_kv_pool* pool);
/** Unmaps every page with no live block, after one device synchronization. 0 on success. */
STITCH_API int stitch_kv_trim(stitch_kv_pool* pool);
/** Unmaps everything, releases the ranges and frees `pool`; fails (the pool stays valid) while
 *  blocks are live. */
STITCH_API int stitch_kv_destroy(stitch_kv_pool* pool);

/** Writes, as JSON, what is resident on `device` (-1: every device): untagged live and cached
 *  memory, private pools, each tag awake, spilled or asleep, spilled bytes, host backups; snprintf-style like
 *  stitch_memory_summary. Returns the full length; 0 on error. */
STITCH_API size_t stitch_residency(int device, char* buf, size_t cap);

/** Caps `device`'s reserved memory at `fraction` (0..1] of its capacity. 0 on success. */
STITCH_API int stitch_set_memory_fraction(double fraction, int device);
/** A statistic by PyTorch name, e.g. "reserved_bytes.all.peak"; -1 if the key or device is
 *  unknown (stitch_last_error() then says which). */
STITCH_API int64_t stitch_stat(int device, const char* key);
/** The number of statistics: stitch_stats() fills this many values. */
STITCH_API size_t stitch_stat_count(void);
/** Flags of stitch_stat_key(). */
#define STITCH_STAT_TORCH 1        /* one of torch.cuda.memory_stats()'s keys */
#define STITCH_STAT_MEMORY_STATS 2 /* returned by stitch.memory_stats() (PyTorch's keys and
                                      num_invalid_frees; stitch's other counters are read by name) */
/** The key of statistic `index` (0 .. stitch_stat_count()-1), e.g. "allocated_bytes.all.peak", a
 *  string that lives as long as the process; its STITCH_STAT_* flags in `*flags` when not NULL.
 *  NULL for an index past the end. */
STITCH_API const char* stitch_stat_key(size_t index, int* flags);
/** Every statistic of `device`, read at once under the device's lock (one consistent snapshot),
 *  into values[0 .. cap) in stitch_stat_key() order. Returns the number of statistics (filling at
 *  most `cap` of them, like snprintf), or -1 for an unknown device (stitch_last_error() says
 *  why). */
STITCH_API int64_t stitch_stats(int device, int64_t* values, size_t cap);
/** Resets every peak statistic of `device` (-1: every device) to its current value. */
STITCH_API int stitch_reset_peak_stats(int device);
/** Resets the running sums (".allocated", ".freed") and the event counters (num_ooms,
 *  num_alloc_retries, ...) of `device` (-1: every device), as
 *  torch.cuda.reset_accumulated_memory_stats(). */
STITCH_API int stitch_reset_accumulated_stats(int device);
/** `device`'s reserved-memory cap as a fraction of its capacity (stitch_set_memory_fraction or
 *  per_process_memory_fraction); 1.0 without a cap, -1.0 on error. */
STITCH_API double stitch_memory_fraction(int device);
/** Turns the allocation history on (enabled != 0) or off on every device, keeping up to
 *  `max_entries` events per device (0: keep the current limit). Off discards the history.
 *  0 on success. */
STITCH_API int stitch_record_history(int enabled, size_t max_entries);
/** Writes a memory snapshot to `path`: a pickle in PyTorch's format (open it at
 *  https://pytorch.org/memory_viz or with python -m torch.cuda._memory_viz), or the same
 *  structure as JSON when `path` ends in ".json". 0 on success. */
STITCH_API int stitch_dump_snapshot(const char* path);
/** Writes torch.cuda.memory_summary()'s table for `device` (plus stitch's fragmentation lines)
 *  into `buf`, snprintf-style: at most cap-1 characters and a NUL (nothing if buf is NULL or cap
 *  is 0). Returns the summary's full length, without the NUL; 0 on error. */
STITCH_API size_t stitch_memory_summary(int device, char* buf, size_t cap);
/** Writes the settings in effect as a `key:value,...` string that stitch_configure() accepts (those
 *  of the allocator, or those it will be built with: STITCH_ALLOC_CONF plus earlier
 *  stitch_configure() calls), snprintf-style like stitch_memory_summary. Returns the full length;
 *  0 on error (a bad STITCH_ALLOC_CONF). Creates nothing. */
STITCH_API size_t stitch_config(char* buf, size_t cap);
/** The number of devices of the configured backend: sim_devices for backend:sim, the driver's
 *  count for backend:cuda (the driver is opened and initialised; no context is created, nor the
 *  allocator). -1 when the backend is unusable (no driver, no device), stitch_last_error() says
 *  why. */
STITCH_API int stitch_device_count(void);
/* ---- memory other processes map (docs/ipc.md) ---------------------------------------------------
 * The block's pages are shared, not copied. The exporter must keep the block allocated until every
 * importer has called stitch_ipc_close (count the importers yourself, as torch.multiprocessing
 * does); from the export until its free the block never moves (compaction skips it, sleep refuses
 * its tag). backend:sim shares all of its memory; backend:cuda shares memory of expandable segments
 * and stitching by file descriptor or fabric handle (ipc:True, the default; a descriptor import
 * needs pidfd_getfd rights over the exporter) and cudaMalloc'd segments by legacy IPC handle
 * (opened in another process only). */
/* Writes a NUL-terminated text handle for the block at ptr; returns its length (0 on error).
   With buf NULL or cap 0 (the size query) it returns the bytes a buffer needs, NUL included (an
   upper bound), and pins and exports nothing. A cap below that fails, saying the bytes needed,
   before anything is pinned or exported. */
STITCH_API size_t stitch_ipc_export(void* ptr, char* buf, size_t cap);
/* Maps the block a handle names on `device`; returns its address here (NULL on error). */
STITCH_API void* stitch_ipc_import(const char* handle, int device);
/* Unmaps an imported block; 0 on success. */
STITCH_API int stitch_ipc_close(void* ptr);
/** The message of this thread's most recent failure, "" if none. Like errno, it is kept until a
 *  later failure replaces it or stitch_clear_error() clears it: successful calls leave it alone,
 *  so the out-of-memory report is still there after reading statistics. Check a call's return
 *  value to know whether it failed. The pointer is valid until this thread's next stitch call. */
STITCH_API const char* stitch_last_error(void);
/** Clears this thread's last error (stitch_last_error() returns "" until the next failure). For
 *  calls whose result cannot signal failure (stitch_free): clear, call, then read the error. */
STITCH_API void stitch_clear_error(void);

#ifdef __cplusplus
}
#endif

#endif /* STITCH_STITCH_H */
