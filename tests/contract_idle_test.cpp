// The contract tier's idle rows (verify/trace/trace.hpp ContractIdle): the
// optimizer calls that applied no update, read from contract.csv (a
// malformed row refused naming the file, line and key) and judged by
// idle_check (verify/contract/idle.cpp): each must move nothing, and one
// that moved the parameters or the optimizer's state names
// optimizer-state-every-micro-step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "sim/errors.hpp"
#include "verify/contract/detail.hpp"
#include "verify/trace/trace.hpp"

namespace accumcheck {
namespace {

using contract_detail::idle_check;

ContractIdle idle(int64_t micro, int64_t changed, int64_t state = -1) {
  ContractIdle e;
  e.micro = micro;
  e.changed = changed;
  e.state_changed = state;
  e.worst = changed > 0 ? 1e-3 : 0;
  return e;
}

TEST(ContractIdle, NoRowsNoCheck) {
  std::string pitfall;
  EXPECT_FALSE(idle_check(ContractSection{}, pitfall).has_value());
  EXPECT_EQ(pitfall, "");
}

TEST(ContractIdle, CallsThatMoveNothingHold) {
  ContractSection c;
  c.idle = {idle(0, 0), idle(1, 0, 0), idle(2, 0)};
  std::string pitfall;
  const auto ck = idle_check(c, pitfall);
  ASSERT_TRUE(ck.has_value());
  EXPECT_TRUE(ck->ok) << ck->message;
  EXPECT_EQ(pitfall, "");
  EXPECT_NE(ck->message.find("3 optimizer call(s)"), std::string::npos)
      << ck->message;
}

TEST(ContractIdle, AMovedParameterNamesThePitfall) {
  ContractSection c;
  c.idle = {idle(0, 0), idle(1, 0), idle(2, 1)};
  c.idle[2].lambda = 1e-3;
  c.idle[2].fit_residual = 2e-5;
  std::string pitfall;
  const auto ck = idle_check(c, pitfall);
  ASSERT_TRUE(ck.has_value());
  EXPECT_FALSE(ck->ok);
  EXPECT_EQ(pitfall, "optimizer-state-every-micro-step");
  EXPECT_NE(ck->message.find("1 of 3 optimizer call(s)"), std::string::npos)
      << ck->message;
  EXPECT_NE(ck->message.find("micro-batch 2's call"), std::string::npos)
      << ck->message;
  EXPECT_NE(ck->message.find("lambda 0.001"), std::string::npos) << ck->message;
}

TEST(ContractIdle, MovedStateAloneNamesThePitfall) {
  // Adam's moments decayed on a micro-step, the parameters untouched.
  ContractSection c;
  c.idle = {idle(0, 0, 0), idle(1, 0, 4)};
  std::string pitfall;
  const auto ck = idle_check(c, pitfall);
  ASSERT_TRUE(ck.has_value());
  EXPECT_FALSE(ck->ok);
  EXPECT_EQ(pitfall, "optimizer-state-every-micro-step");
  EXPECT_NE(ck->message.find("4 of the optimizer's sampled state values"),
            std::string::npos)
      << ck->message;
}

// contract.csv with two micro-batches and the given idle rows.
std::string write_trace(const std::string& name, const std::string& rows) {
  const std::string dir = ::testing::TempDir() + "accumcheck_idle/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/contract.csv")
      << "kind,index,ref,epoch,version,items,samples,value,residual,scale\n"
         "micro,0,,0,0,4,4,,,\nmicro,1,,0,0,4,4,,,\n"
      << rows;
  return dir;
}

TEST(ContractIdle, ReadsTheRows) {
  const ContractSection c = read_contract(write_trace(
      "ok", "idle,0,0,,0,0,,0,,\nidle,1,1,,0,192,3,0.001,0.001,2e-05\n"));
  ASSERT_EQ(c.idle.size(), 2u);
  EXPECT_EQ(c.idle[0].changed, 0);
  EXPECT_EQ(c.idle[0].state_changed, -1);
  EXPECT_EQ(c.idle[1].micro, 1);
  EXPECT_EQ(c.idle[1].changed, 192);
  EXPECT_EQ(c.idle[1].state_changed, 3);
  EXPECT_DOUBLE_EQ(c.idle[1].worst, 0.001);
  EXPECT_DOUBLE_EQ(c.idle[1].lambda, 0.001);
  EXPECT_DOUBLE_EQ(c.idle[1].fit_residual, 2e-5);
}

TEST(ContractIdle, RefusesMalformedRows) {
  struct Bad {
    const char* name;
    const char* row;
    const char* key;
  };
  for (const Bad& b : {
           Bad{"unknown_micro", "idle,0,7,,0,0,,0,,\n", "ref"},
           Bad{"order", "idle,1,0,,0,0,,0,,\n", "index"},
           Bad{"negative_changed", "idle,0,0,,0,-1,,0,,\n", "items"},
           Bad{"no_changed", "idle,0,0,,0,,,0,,\n", "items"},
           Bad{"bad_state", "idle,0,0,,0,0,-2,0,,\n", "samples"},
           Bad{"no_version", "idle,0,0,,,0,,0,,\n", "version"},
           Bad{"no_value", "idle,0,0,,0,0,,,,\n", "value"},
           Bad{"negative_value", "idle,0,0,,0,0,,-1,,\n", "value"},
           Bad{"text_value", "idle,0,0,,0,0,,x,,\n", "value"},
       }) {
    const std::string dir = write_trace(b.name, b.row);
    try {
      read_contract(dir);
      ADD_FAILURE() << b.name << ": read without an error";
    } catch (const InputError& e) {
      EXPECT_EQ(e.key(), b.key) << b.name << ": " << e.what();
      EXPECT_EQ(e.line(), 4) << b.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("contract.csv"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace accumcheck
