#include "host/HostAllocator.h"

#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace flagos::host {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatType;

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeThreshold = 1 << 20;
constexpr size_t kLargeRound = 1 << 16;
// Each block's bookkeeping sits in the kAlignment bytes in front of its data,
// so a free finds it from the data pointer with no lookup.
constexpr size_t kHeader = kAlignment;

size_t roundSize(size_t n) {
  const size_t unit = n < kLargeThreshold ? kSmallRound : kLargeRound;
  return ((n + unit - 1) / unit) * unit;
}

void updateStat(Stat& stat, int64_t amount) {
  stat.current += amount;
  stat.peak = std::max(stat.peak, stat.current);
  if (amount > 0) {
    stat.allocated += amount;
  } else {
    stat.freed += -amount;
  }
}

// The aggregate and the pool of a block of `size` bytes: small below
// kLargeThreshold (CUDA's allocator splits its pools at 1 MiB too), so that
// "all" is the sum of small_pool and large_pool, as in torch.cuda's stats.
void update(c10::CachingDeviceAllocator::StatArray& stats, int64_t amount, size_t size) {
  updateStat(stats[static_cast<size_t>(StatType::AGGREGATE)], amount);
  updateStat(stats[static_cast<size_t>(size < kLargeThreshold ? StatType::SMALL_POOL : StatType::LARGE_POOL)], amount);
}

} // namespace

struct HostCachingAllocator::Block {
  void* data;
  size_t size;
  size_t requested;
  Pool* pool;
};
static_assert(sizeof(HostCachingAllocator::Block) <= kHeader && std::is_trivially_destructible_v<HostCachingAllocator::Block>);

struct HostCachingAllocator::Pool {
  std::mutex mutex;
  // Free blocks by size: below kLargeThreshold one list per 512-byte size
  // class (an index, no hashing on the hot path), above it a map.
  std::vector<std::vector<Block*>> small_free = std::vector<std::vector<Block*>>(kLargeThreshold / kSmallRound);
  std::unordered_map<size_t, std::vector<Block*>> large_free;
  // Every block this pool holds, by data pointer: changes only when memory
  // comes from or goes back to the system, and tells raw_deallocate'd
  // pointers of this pool from the CPU allocator's (releaseByData).
  std::unordered_map<void*, Block*> by_data;
  DeviceStats stats;
  c10::DeviceIndex index = 0;

  // As CPU's and CUDA's allocators: torch.profiler(profile_memory=True)
  // counts the bytes against the op that allocates or frees them.
  void reportToProfiler(void* data, int64_t bytes) const {
    c10::reportMemoryUsageToProfiler(
        data, bytes, static_cast<size_t>(stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current),
        static_cast<size_t>(stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current),
        c10::Device(c10::DeviceType::PrivateUse1, index));
  }

  std::vector<Block*>& freeList(size_t size) {
    return size < kLargeThreshold ? small_free[size / kSmallRound] : large_free[size];
  }

  void releaseLocked(Block* block) {
    update(stats.allocated_bytes, -static_cast<int64_t>(block->size), block->size);
    update(stats.requested_bytes, -static_cast<int64_t>(block->requested), block->size);
    update(stats.allocation, -1, block->size);
    freeList(block->size).push_back(block);
    reportToProfiler(block->data, -static_cast<int64_t>(block->size));
  }

  void release(Block* block) {
    std::lock_guard<std::mutex> lock(mutex);
    releaseLocked(block);
  }

  bool releaseByData(void* data) {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = by_data.find(data);
    if (found == by_data.end()) {
      return false;
    }
    releaseLocked(found->second);
    return true;
  }

  // Every free block back to the system (the caller holds the lock).
  void releaseCachedLocked() {
    auto release = [&](std::vector<Block*>& blocks) {
      for (Block* block : blocks) {
        by_data.erase(block->data);
        update(stats.reserved_bytes, -static_cast<int64_t>(block->size), block->size);
        update(stats.segment, -1, block->size);
        ++stats.num_device_free;
        std::free(block); // the header starts the allocation
      }
      blocks.clear();
    };
    for (auto& blocks : small_free) {
      release(blocks);
    }
    for (auto& [size, blocks] : large_free) {
      release(blocks);
    }
    large_free.clear();
  }
};

namespace {

// The deleter of every block this pool hands out (context = data pointer):
// the header is there.
void freeBlock(void* data) {
  auto* block = reinterpret_cast<HostCachingAllocator::Block*>(static_cast<char*>(data) - kHeader);
  TORCH_INTERNAL_ASSERT(block->data == data, "flagos: freeing host memory the pool does not know");
  block->pool->release(block);
}
} // namespace

bool HostCachingAllocator::releaseByData(void* data) {
  for (auto& pool : pools_) {
    if (pool->releaseByData(data)) {
      return true;
    }
  }
  return false;
}

HostCachingAllocator::HostCachingAllocator(
    c10::DeviceIndex devices,
    std::function<c10::DeviceIndex()> current_device)
    : current_device_(std::move(current_device)) {
  for (c10::DeviceIndex i = 0; i < devices; ++i) {
    pools_.push_back(std::make_unique<Pool>());
    pools_.back()->index = i;
  }
}

HostCachingAllocator::~HostCachingAllocator() = default;


void HostCachingAllocator::invalidDevice(c10::DeviceIndex index) const {
  const int count = static_cast<int>(pools_.size());
  TORCH_CHECK(
      false, "flagos:", static_cast<int>(index), " is not a valid device: the host runtime has ", count,
      " flagos device(s), flagos:0 to flagos:", count - 1);
}

c10::DataPtr HostCachingAllocator::allocate(size_t nbytes) {
  const c10::DeviceIndex index = current_device_();
  return allocateOn(nbytes, index, c10::Device(c10::DeviceType::PrivateUse1, index));
}

c10::DataPtr HostCachingAllocator::allocateOn(size_t nbytes, c10::DeviceIndex index, c10::Device label) {
  checkDevice(index);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, label);
  }
  Pool& pool = *pools_[index];
  const size_t size = roundSize(nbytes);
  std::lock_guard<std::mutex> lock(pool.mutex);
  Block* block = nullptr;
  std::vector<Block*>& free_list = pool.freeList(size);
  if (!free_list.empty()) {
    block = free_list.back();
    free_list.pop_back();
  } else {
    void* raw = std::aligned_alloc(kAlignment, kHeader + size);
    if (C10_UNLIKELY(raw == nullptr)) {
      // As CUDA's allocator: the cached free blocks go back, then one retry.
      pool.releaseCachedLocked();
      ++pool.stats.num_alloc_retries;
      raw = std::aligned_alloc(kAlignment, kHeader + size);
    }
    if (C10_UNLIKELY(raw == nullptr)) {
      ++pool.stats.num_ooms;
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "flagos: flagos:", static_cast<int>(index), " (host runtime) is out of memory: ",
          "tried to allocate ", size, " bytes with ",
          pool.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current,
          " bytes in use by flagos tensors on it; host RAM is its memory (torch.flagos.mem_get_info)");
    }
    block = new (raw) Block{static_cast<char*>(raw) + kHeader, size, 0, &pool};
    pool.by_data.emplace(block->data, block);
    update(pool.stats.reserved_bytes, static_cast<int64_t>(size), size);
    update(pool.stats.segment, 1, size);
    ++pool.stats.num_device_alloc;
  }
  block->requested = nbytes;
  update(pool.stats.allocated_bytes, static_cast<int64_t>(size), size);
  update(pool.stats.requested_bytes, static_cast<int64_t>(nbytes), size);
  update(pool.stats.allocation, 1, size);
  pool.reportToProfiler(block->data, static_cast<int64_t>(size));
  return c10::DataPtr(block->data, block->data, &freeBlock, label);
}

void HostCachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

void HostCachingAllocator::emptyCache(c10::MempoolId_t /*pool*/) {
  for (auto& pool : pools_) {
    std::lock_guard<std::mutex> lock(pool->mutex);
    pool->releaseCachedLocked();
  }
}

DeviceStats HostCachingAllocator::getDeviceStats(c10::DeviceIndex index) {
  checkDevice(index);
  std::lock_guard<std::mutex> lock(pools_[index]->mutex);
  DeviceStats stats = pools_[index]->stats;
  // A block is active exactly while it is allocated (no split blocks, no
  // frees deferred to a stream), so those figures are not kept twice.
  stats.active = stats.allocation;
  stats.active_bytes = stats.allocated_bytes;
  return stats;
}

void HostCachingAllocator::resetAccumulatedStats(c10::DeviceIndex index) {
  checkDevice(index);
  std::lock_guard<std::mutex> lock(pools_[index]->mutex);
  auto reset = [](c10::CachingDeviceAllocator::StatArray& stats) {
    for (auto& s : stats) {
      s.allocated = 0;
      s.freed = 0;
    }
  };
  DeviceStats& s = pools_[index]->stats;
  for (auto* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
    reset(*a);
  }
  // The counters too, as CUDA's allocator resets them.
  s.num_alloc_retries = 0;
  s.num_ooms = 0;
  s.num_device_alloc = 0;
  s.num_device_free = 0;
}

void HostCachingAllocator::resetPeakStats(c10::DeviceIndex index) {
  checkDevice(index);
  std::lock_guard<std::mutex> lock(pools_[index]->mutex);
  DeviceStats& s = pools_[index]->stats;
  for (auto* a : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
    for (auto& stat : *a) {
      stat.peak = stat.current;
    }
  }
}

std::pair<size_t, size_t> HostCachingAllocator::getMemoryInfo(c10::DeviceIndex /*index*/) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
  return {static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page, static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
}

// Pinned memory on the host runtime is ordinary host memory that remembers
// it was asked for as pinned.
static PinnedAllocator* g_pinned = nullptr;

void freePinned(void* ctx) {
  {
    std::lock_guard<std::mutex> lock(g_pinned->mutex_);
    g_pinned->live_.erase(ctx);
  }
  std::free(ctx);
}

c10::DataPtr PinnedAllocator::allocate(size_t nbytes) {
  g_pinned = this;
  void* data = std::aligned_alloc(kAlignment, roundSize(std::max<size_t>(nbytes, 1)));
  TORCH_CHECK(data != nullptr, "flagos: out of host memory allocating ", nbytes, " pinned bytes");
  std::lock_guard<std::mutex> lock(mutex_);
  live_.insert(data);
  return c10::DataPtr(data, data, &freePinned, c10::Device(c10::DeviceType::CPU));
}

void PinnedAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool PinnedAllocator::isPinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Storages start at the block, so their base pointer is what is asked.
  return live_.count(ptr) != 0;
}

} // namespace flagos::host
