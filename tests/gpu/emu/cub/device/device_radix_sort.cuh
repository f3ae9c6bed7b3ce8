/* tests/gpu/emu/cub/device/device_radix_sort.cuh — stands in for CUB's radix sort in the CPU
 * emulation of the CUDA backend: cub::DeviceRadixSort::SortPairs as a stable sort of the pairs by
 * bits [begin_bit, end_bit) of the keys (what an LSD radix sort gives). The size query (temp NULL)
 * asks for 256 bytes; a call checks that its temporary storage and its key and value arrays lie in
 * device allocations and that temp_bytes is what the query gave, and scribbles over the storage. */
#ifndef TPK_EMU_CUB_RADIX_SORT
#define TPK_EMU_CUB_RADIX_SORT

#include <algorithm>
#include <vector>

#include "../../tpk_emu.h"

namespace cub {
struct DeviceRadixSort {
    template <class K, class V, class N>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out,
                                 const V *values_in, V *values_out, N num_items, int begin_bit = 0,
                                 int end_bit = (int)sizeof(K) * 8, cudaStream_t stream = 0) {
        (void)stream;
        static_assert(std::is_unsigned<K>::value, "the emulation sorts unsigned keys");
        enum { TEMP = 256 };
        if (!temp) {
            temp_bytes = TEMP;
            return cudaSuccess;
        }
        size_t n = (size_t)num_items;
        if (num_items < 0 || temp_bytes < TEMP || begin_bit < 0 || end_bit > (int)sizeof(K) * 8 ||
            begin_bit > end_bit) {
            tpk_emu_fail(
                "cub::DeviceRadixSort::SortPairs: bad arguments (n %lld, temp_bytes %zu, bits [%d, "
                "%d))",
                (long long)num_items, temp_bytes, begin_bit, end_bit);
            return cudaErrorInvalidValue;
        }
        if (!tpk_emu_check_device(temp, temp_bytes, "SortPairs temp") ||
            !tpk_emu_check_device(keys_in, n * sizeof(K), "SortPairs keys_in") ||
            !tpk_emu_check_device(keys_out, n * sizeof(K), "SortPairs keys_out") ||
            !tpk_emu_check_device(values_in, n * sizeof(V), "SortPairs values_in") ||
            !tpk_emu_check_device(values_out, n * sizeof(V), "SortPairs values_out"))
            return cudaErrorInvalidValue;
        memset(temp, 0xff, temp_bytes);
        K mask = end_bit - begin_bit >= (int)sizeof(K) * 8
                     ? (K) ~(K)0
                     : (K)(((K)1 << (end_bit - begin_bit)) - 1);
        std::vector<size_t> idx(n);
        for (size_t i = 0; i < n; i++) idx[i] = i;
        std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
            return (K)((keys_in[a] >> begin_bit) & mask) < (K)((keys_in[b] >> begin_bit) & mask);
        });
        std::vector<K> k(n);
        std::vector<V> v(n);
        for (size_t i = 0; i < n; i++) k[i] = keys_in[idx[i]], v[i] = values_in[idx[i]];
        std::copy(k.begin(), k.end(), keys_out);
        std::copy(v.begin(), v.end(), values_out);
        return cudaSuccess;
    }
};
} // namespace cub

#endif
