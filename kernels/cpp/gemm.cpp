// gemm: c = a @ b for row-major float32 a (m, k), b (k, n), c (m, n).
//
// Blocked for the cache, not packed. The loops run over NC-column blocks of b, then KC-row
// blocks: that KC x NC panel of b (128 KiB) stays in L2 while every MR-row strip of a
// multiplies it. Each MR x NR tile of c accumulates one k block in a local array (registers,
// for full tiles), then is stored (first k block) or added to c. Threads split the MR-row
// strips, the same strips in every block, so each thread keeps writing its own rows of c.
#include <algorithm>
#include <cstdint>

#include "common.h"

namespace {

#ifdef __AVX512F__
constexpr int64_t VEC = 16;  // floats per vector register
#else
constexpr int64_t VEC = 8;   // AVX2; a narrower ISA just splits each row of the tile further
#endif
// Register tile MR x NR: 12 accumulator registers, plus two for a row of b and one for a broadcast
// element of a (AVX2 has 16). KC x NC: the cache block of b, 128 KiB.
constexpr int64_t MR = 6, NR = 2 * VEC, KC = 256, NC = 128;

// c[i0:i0+mr, j0:j0+nr] (+)= a[i0:i0+mr, k0:k1] @ b[k0:k1, j0:j0+nr]. FULL tiles have the
// compile-time extent MR x NR, so the tile loops unroll and acc is kept in registers; edge tiles
// (m or n not a multiple of the tile) run the same code with their runtime extent.
template <bool FULL>
inline void tile(const float* GT_RESTRICT a, const float* GT_RESTRICT b, float* GT_RESTRICT c, int64_t k,
                 int64_t n, int64_t i0, int64_t j0, int64_t k0, int64_t k1, int64_t mr, int64_t nr) {
    const int64_t rows = FULL ? MR : mr, cols = FULL ? NR : nr;
    float acc[MR][NR] = {};
    for (int64_t p = k0; p < k1; ++p) {
        const float* GT_RESTRICT bp = b + p * n + j0;
        for (int64_t i = 0; i < rows; ++i) {
            const float aip = a[(i0 + i) * k + p];
            #pragma omp simd
            for (int64_t j = 0; j < cols; ++j) acc[i][j] += aip * bp[j];
        }
    }
    for (int64_t i = 0; i < rows; ++i) {
        float* GT_RESTRICT ci = c + (i0 + i) * n + j0;
        #pragma omp simd
        for (int64_t j = 0; j < cols; ++j) ci[j] = k0 == 0 ? acc[i][j] : ci[j] + acc[i][j];
    }
}

}  // namespace

extern "C" void gemm_cpp(const float* GT_RESTRICT a, const float* GT_RESTRICT b, float* GT_RESTRICT c,
                         int64_t m, int64_t k, int64_t n) {
    #pragma omp parallel
    for (int64_t j0 = 0; j0 < n; j0 += NC) {
        const int64_t j1 = std::min(j0 + NC, n);
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            const int64_t k1 = std::min(k0 + KC, k);
            // static, same trip count every block: OpenMP gives each thread the same strips every time,
            // so only their owner touches a row of c, in k-block order, and no barrier is needed
            #pragma omp for schedule(static) nowait
            for (int64_t i0 = 0; i0 < m; i0 += MR) {
                const int64_t mr = std::min(MR, m - i0);
                for (int64_t jt = j0; jt < j1; jt += NR) {
                    const int64_t nr = std::min(NR, j1 - jt);
                    if (mr == MR && nr == NR) tile<true>(a, b, c, k, n, i0, jt, k0, k1, mr, nr);
                    else tile<false>(a, b, c, k, n, i0, jt, k0, k1, mr, nr);
                }
            }
        }
    }
}
