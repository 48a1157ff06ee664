// softmax: out = exp(x - max) / sum(exp(x - max)) over each row of a (rows, cols) float32 x.
#include <cmath>
#include <cstdint>

#include "common.h"

extern "C" void softmax_cpp(const float* GT_RESTRICT x, float* GT_RESTRICT out, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* GT_RESTRICT xr = x + r * cols;
        float* GT_RESTRICT outr = out + r * cols;
        float row_max = -INFINITY;
        #pragma omp simd reduction(max : row_max)
        for (int64_t c = 0; c < cols; ++c) row_max = xr[c] > row_max ? xr[c] : row_max;
        // exponents x - max <= 0: inside gt_expf's domain; the row is written once and rescaled in L1
        float sum = 0.0f;
        #pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < cols; ++c) {
            const float e = gt_expf(xr[c] - row_max);
            outr[c] = e;
            sum += e;
        }
        const float inv_sum = 1.0f / sum;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) outr[c] *= inv_sum;
    }
}
