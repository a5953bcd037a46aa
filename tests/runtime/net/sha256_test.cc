// kolo's SHA-256 and HMAC-SHA256 against the published vectors (FIPS 180-4
// examples, RFC 4231) and, on random inputs, against OpenSSL (linked by
// this test only).
#include "runtime/net/sha256.h"

#include <openssl/evp.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "tests/testing/raw_protocol.h"

namespace kolo {
namespace net {
namespace {

std::string Hex(const Sha256::Digest& digest) {
  return absl::BytesToHexString(absl::string_view(
      reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::string Bytes(const std::string& hex) {
  return absl::HexStringToBytes(hex);
}

std::string OpenSslSha256(const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string AsString(const Sha256::Digest& d) {
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// FIPS 180-4's examples (NIST's "SHA256.pdf", "SHA2_Additional.pdf").
TEST(Sha256Test, FipsVectors) {
  EXPECT_EQ(Hex(Sha256::Hash("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(Sha256::Hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256::Hash(
                "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(Sha256::Hash(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // One byte 0xbd, and 1000 zero bytes (SHA2_Additional.pdf).
  EXPECT_EQ(Hex(Sha256::Hash("\xbd")),
            "68325720aabd7c82f30f554b313d0570c95accbb7dc4b5aae11204c08ffe732b");
  EXPECT_EQ(Hex(Sha256::Hash(std::string(1000, '\0'))),
            "541b3e9daa09b20bf85fa273e5cbd3e80185aa4ec298e765db87742b70138a53");
}

// Every split of an input into two Update() calls, across the padding
// boundaries (55, 56, 63, 64 bytes...), gives the one-shot digest.
TEST(Sha256Test, IncrementalUpdatesAgree) {
  std::string data(300, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300}) {
    const std::string input = data.substr(0, len);
    const std::string expected = OpenSslSha256(input);
    ASSERT_EQ(AsString(Sha256::Hash(input)), expected) << len;
    for (size_t split = 0; split <= len; ++split) {
      Sha256 hash;
      hash.Update(absl::string_view(input).substr(0, split));
      hash.Update(absl::string_view(input).substr(split));
      ASSERT_EQ(AsString(hash.Finish()), expected) << len << " " << split;
    }
  }
}

// "abc" padded to one block (FIPS 180-4, 5.1.1) through the portable
// compression function alone, whatever the CPU.
TEST(Sha256Test, PortableCompressionOnTheAbcBlock) {
  uint8_t block[Sha256::kBlockBytes] = {'a', 'b', 'c', 0x80};
  block[63] = 24;  // the length in bits
  uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  sha256_internal::CompressPortable(state, block, 1);
  const std::vector<uint32_t> expected = {0xba7816bf, 0x8f01cfea, 0x414140de,
                                          0x5dae2223, 0xb00361a3, 0x96177a9c,
                                          0xb410ff61, 0xf20015ad};
  EXPECT_EQ(std::vector<uint32_t>(state, state + 8), expected);
}

// The two compression functions agree on random blocks.
TEST(Sha256Test, ShaExtensionsMatchThePortableCode) {
  if (!sha256_internal::HaveShaExtensions()) {
    GTEST_SKIP() << "this CPU has no SHA extensions; only the portable "
                    "compression function is in use here";
  }
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t blocks = 1 + trial % 5;
    std::vector<uint8_t> data(blocks * Sha256::kBlockBytes);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    uint32_t a[8], b[8];
    for (int i = 0; i < 8; ++i) a[i] = b[i] = static_cast<uint32_t>(rng());
    sha256_internal::CompressPortable(a, data.data(), blocks);
    sha256_internal::CompressShaExtensions(b, data.data(), blocks);
    ASSERT_EQ(std::vector<uint32_t>(a, a + 8), std::vector<uint32_t>(b, b + 8))
        << "trial " << trial;
  }
}

struct Rfc4231Case {
  std::string key;
  std::string data;
  std::string mac_hex;  // case 5 is truncated to 128 bits
};

TEST(HmacSha256Test, Rfc4231Vectors) {
  const std::vector<Rfc4231Case> cases = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {Bytes("0102030405060708090a0b0c0d0e0f10111213141516171819"),
       std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(20, '\x0c'), "Test With Truncation",
       "a3b6167473100ee06e0c796c2955552b"},
      {std::string(131, '\xaa'),
       "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than "
       "block-size data. The key needs to be hashed before being used by the "
       "HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Rfc4231Case& c = cases[i];
    const std::string mac = Hex(HmacSha256(c.key).Mac({c.data}));
    EXPECT_EQ(mac.substr(0, c.mac_hex.size()), c.mac_hex)
        << "RFC 4231 test case " << i + 1;
  }
}

// Random keys (shorter than, equal to and longer than a block) and data in
// random pieces, against OpenSSL's HMAC over the concatenation.
TEST(HmacSha256Test, AgreesWithOpenSslOnRandomInputs) {
  std::mt19937_64 rng(2024);
  auto random_bytes = [&rng](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string key = random_bytes(rng() % 150);
    const std::string a = random_bytes(rng() % 200);
    const std::string b = random_bytes(rng() % 5000);
    const std::string c = random_bytes(rng() % 70);
    const HmacSha256 hmac(key);
    const std::string expected = ::kolo::testing::Hmac(key, a + b + c);
    ASSERT_EQ(hmac.MacString({a, b, c}), expected) << "trial " << trial;
    // The precomputed state is reused, not consumed.
    ASSERT_EQ(hmac.MacString({a + b + c}), expected) << "trial " << trial;
  }
}

TEST(HmacSha256Test, ConstantTimeEqual) {
  EXPECT_TRUE(ConstantTimeEqual("", ""));
  EXPECT_TRUE(ConstantTimeEqual("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "xbc"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEqual(std::string(32, '\0'), std::string(31, '\0')));
}

}  // namespace
}  // namespace net
}  // namespace kolo
