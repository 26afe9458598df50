// The paged KV cache's address policy: where key `key` of sequence b, KV head kv lives.
//
// The idea. A serving engine does not give each sequence one contiguous cache of the longest
// length it might reach; it cuts the cache into pages of page_size tokens and gives each
// sequence the pages it needs as it grows (vLLM's PagedAttention, FlashAttention-2's
// `block_table`). The layout is theirs:
//     k_pages, v_pages  [num_pages, page_size, H_kv, D]   (contiguous; fp16 or bf16)
//     block_table       [B, max_pages] int32              page j of sequence b
//     seq_lens          [B] int32                          keys of sequence b
// so key t of sequence b is row t % page_size of page block_table[b][t / page_size]. Page
// sizes are the powers of two 16 .. 256: the division is a shift, and a page holds whole
// 16-key tiles of the decode kernel (a tile that starts off a page boundary, as a window's
// first does, spans two pages; each of its rows is looked up on its own).
//
// Nothing else changes: task5/decode_gqa.cu's kernel body is shared, and only the address of
// a K/V row comes from a policy chosen by a template parameter: ContiguousKv (decode_gqa.cu:
// base + key * stride) or PagedKv (here: one block-table lookup per row). rope_append.cu
// writes new tokens' rows through the same policy (PagedKv::cache_row). The entry points are
// in task5/decode_paged.cu.
//
// A table entry or a length on the device was never checked on the host: a page id outside
// [0, num_pages) reads nothing (its rows are zeros) and writes nothing, and lengths are clamped
// to max_pages * page_size, so no kernel reads or writes outside the pages or the table.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_mask.cuh"

namespace attn_decode {

constexpr int kMinPageSize = 16;   // one decode key tile (16 keys; 32 at head dim 64: two pages)
constexpr int kMaxPageSize = 256;

// The K and V rows of one key, and whether the key's page exists (else: read nothing).
template <typename Element>
struct KvRow {
  const Element* k;
  const Element* v;
  bool valid;
};

// The paged cache as the kernels see it (filled on the host by paged_kv in decode_paged.cu).
// Strides in elements: a page is page_size * H_kv * D, a token row H_kv * D, a head D.
struct PagedKv {
  void* k_pages;
  void* v_pages;
  const int* block_table;   // [B, max_pages] int32
  int64_t table_stride;     // elements between two sequences' rows of the table
  int max_pages, num_pages;
  int page_shift;           // log2(page_size)
  int64_t page_stride, row_stride, head_stride;

  // The page of position `position` of sequence b, or -1 if the table has no such page or its
  // entry is not a page.
  __device__ __forceinline__ int page_of(int64_t b, int64_t position) const {
    const int64_t slot = position >> page_shift;
    if (position < 0 || slot >= max_pages) return -1;
    const int page = __ldg(block_table + b * table_stride + slot);
    return page >= 0 && page < num_pages ? page : -1;
  }

  // Element offset of (page, row within the page, head).
  __device__ __forceinline__ int64_t offset(int page, int64_t position, int head) const {
    const int64_t in_page = position & ((int64_t{1} << page_shift) - 1);
    return static_cast<int64_t>(page) * page_stride + in_page * row_stride + head * head_stride;
  }

  // The rows of one (sequence, KV head), as decode_gqa.cu's kernel reads them: the values it
  // needs, copied (a pointer to a kernel parameter would move the parameters to local memory).
  template <typename Element>
  struct Rows {
    const Element* k;    // head kv of row 0 of page 0
    const Element* v;
    const int* table;    // sequence b's row of the block table
    int num_pages, page_shift;
    int64_t page_stride, row_stride;
    __device__ __forceinline__ Rows(const PagedKv& c, int64_t b, int kv)
        : k(static_cast<const Element*>(c.k_pages) + kv * c.head_stride),
          v(static_cast<const Element*>(c.v_pages) + kv * c.head_stride),
          table(c.block_table + b * c.table_stride),
          num_pages(c.num_pages), page_shift(c.page_shift), page_stride(c.page_stride),
          row_stride(c.row_stride) {}
    // Key `key` (0 <= key < max_pages * page_size: the kernel reads no key past the clamped
    // length) of this sequence.
    __device__ __forceinline__ KvRow<Element> at(int key) const {
      const int page = __ldg(table + (key >> page_shift));
      const bool valid = page >= 0 && page < num_pages;
      const int64_t off = static_cast<int64_t>(valid ? page : 0) * page_stride +
                          static_cast<int64_t>(key & ((1 << page_shift) - 1)) * row_stride;
      return {k + off, v + off, valid};
    }
  };

  // Where rope_append.cu writes head `head` of the K (or V) row of sequence b at `position`:
  // nullptr when the table has no page for it.
  template <typename T>
  __device__ __forceinline__ T* cache_row(bool is_key, int64_t b, int64_t position, int head) const {
    const int page = page_of(b, position);
    if (page < 0) return nullptr;
    return static_cast<T*>(is_key ? k_pages : v_pages) + offset(page, position, head);
  }
};

// The host side (paged_kv, which decode_paged.cu defines, and launch_decode_gqa_paged, which
// decode_gqa.cu does) is declared in decode_common.cuh: this header includes no torch header, so
// that decode_gqa.cuh's kernel, which takes PagedKv, does not either.

}  // namespace attn_decode
