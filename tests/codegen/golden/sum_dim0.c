int kernel0(float* restrict a_in0, float* restrict a_buf0) {
    int64_t status = 0;
    for (int64_t b1 = 0; b1 < 1; b1++) {
        int64_t lanes = 12 - b1 * 12 < 12 ? 12 - b1 * 12 : 12;
        float acc1[12];
        for (int64_t l = 0; l < 12; l++) { acc1[l] = 0; }
        for (int64_t r0_0 = 0; r0_0 < 5; r0_0++) {
            #pragma omp simd
            for (int64_t l2 = 0; l2 < lanes; l2++) {
                float v3 = a_in0[(12*b1 + l2 + 12*r0_0)];
                acc1[l2] += v3;
            }
        }
        #pragma omp simd
        for (int64_t l0 = 0; l0 < lanes; l0++) {
            float v4 = (float)acc1[l0];
            a_buf0[(12*b1 + l0)] = v4;
        }
    }
    return (int)(status != 0);
}
