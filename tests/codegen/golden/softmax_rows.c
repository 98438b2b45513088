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
        float acc7 = 0;
        #pragma omp simd reduction(+:acc7)
        for (int64_t r1_1 = 0; r1_1 < 10; r1_1++) {
            float v8 = a_in0[(10*i0 + r1_1)];
            float v9 = (v8 - v4);
            float v10 = expf(v9);
            acc7 += v10;
        }
        float v11 = (float)acc7;
        #pragma omp simd
        for (int64_t j1 = 0; j1 < 10; j1++) {
            float v0 = a_in0[(10*i0 + j1)];
            float v5 = (v0 - v4);
            float v6 = expf(v5);
            float v12 = (v6 / v11);
            a_out0[(10*i0 + j1)] = v12;
        }
    }
    return (int)(status != 0);
}
