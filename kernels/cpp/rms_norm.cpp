// rms_norm: out = x / sqrt(mean(x², row) + eps) * weight, for a (rows, cols) float32 x.
#include <cmath>
#include <cstdint>

#include "common.h"

extern "C" void rms_norm_cpp(const float* GT_RESTRICT x, const float* GT_RESTRICT weight, float* GT_RESTRICT out,
                             int64_t rows, int64_t cols, float eps) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* GT_RESTRICT xr = x + r * cols;
        float* GT_RESTRICT outr = out + r * cols;
        // float lanes, each summing every lane-th square, then combined: the error bound
        // grows with cols / lanes, not cols (see kernels/cpp_kernels.py)
        float sum_sq = 0.0f;
        #pragma omp simd reduction(+ : sum_sq)
        for (int64_t c = 0; c < cols; ++c) sum_sq += xr[c] * xr[c];
        const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(cols) + eps);
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) outr[c] = xr[c] * inv_rms * weight[c];
    }
}
