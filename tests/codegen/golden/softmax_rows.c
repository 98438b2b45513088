int kernel0(float* restrict a_in0, float* restrict a_out0) {
    int64_t status = 0;
    for (int64_t i0 = 0; i0 < 4; i0++) {
        float acc2 = -INFINITY;
        int nan1 = 0;
        #pragma omp simd reduction(max:acc2) reduction(|:nan1)
        for (int64_t r0_1 = 0; r0_1 < 10; r0_1++) {
            float v3 = a_in0[(10*i0 + r0_1)];
            acc2 = v3 > acc2 ? v3 : acc2;
            nan1 |= (v3 != v3);
        }
        if (nan1) acc2 = NAN;
        float v4 = (float)acc2;
        float v5 = v4;
        float acc8 = 0;
        #pragma omp simd reduction(+:acc8)
        for (int64_t r1_1 = 0; r1_1 < 10; r1_1++) {
            float v9 = a_in0[(10*i0 + r1_1)];
            float v10 = (v9 - v5);
            float v11 = expf(v10);
            acc8 += v11;
        }
        float v12 = (float)acc8;
        #pragma omp simd
        for (int64_t j1 = 0; j1 < 10; j1++) {
            float v0 = a_in0[(10*i0 + j1)];
            float v6 = (v0 - v5);
            float v7 = expf(v6);
            float v13 = (v7 / v12);
            a_out0[(10*i0 + j1)] = v13;
        }
    }
    return (int)(status != 0);
}
