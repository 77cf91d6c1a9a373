// CRC-32C: the crc32 instruction where the compiler may use SSE 4.2, else slice-by-8 tables; both
// give the same values (tests/unit/test_checkpoint.c checks the standard test vector).
#include "common/crc32c.h"

#include <string.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>

uint32_t crc32c(uint32_t crc, const void* bytes, size_t n) {
    const unsigned char* p = bytes;
    uint64_t c = ~crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n > 0; p++, n--) c32 = _mm_crc32_u8(c32, *p);
    return ~c32;
}

#else
#include <pthread.h>

// table[k][b]: the CRC of byte b followed by k zero bytes (reflected polynomial 0x82F63B78).
static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xFF];
}

uint32_t crc32c(uint32_t crc, const void* bytes, size_t n) {
    pthread_once(&table_once, make_table);
    const unsigned char* p = bytes;
    uint32_t c = ~crc;
    for (; n >= 8; p += 8, n -= 8) { // little endian: the first four bytes are the low word
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
            table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    }
    for (; n > 0; p++, n--) c = (c >> 8) ^ table[0][(c ^ *p) & 0xFF];
    return ~c;
}
#endif
