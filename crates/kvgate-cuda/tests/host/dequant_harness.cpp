// For tests/host_dequant.rs: one matrix's rows in a weight layout (format code, rows, cols and row bytes
// on the command line, the bytes on stdin) written out element by element as kernels/model.cu's
// dequant_chunk gives them (f32, native endianness).
#include <cstdio>

#include "cuda_host.h"
#include "model.cu"

int main(int argc, char** argv) {
    if (argc != 5) return 2;
    int fmt = atoi(argv[1]), rows = atoi(argv[2]), cols = atoi(argv[3]);
    long row_bytes = atol(argv[4]);
    std::vector<u8> data((size_t)rows * row_bytes);
    if (fread(data.data(), 1, data.size(), stdin) != data.size()) return 3;
    float w[32];
    for (int r = 0; r < rows; r++)
        for (int c = 0; 32 * c < cols; c++) {
            dequant_chunk(data.data() + (size_t)r * row_bytes, fmt, c, cols, w);
            fwrite(w, 4, std::min(32, cols - 32 * c), stdout);
        }
    return 0;
}
