/*
 * helper_costs.c: the probe behind the breakdown table in docs/kernel.md
 * ("Where the time goes"). Hand-assembled XDP programs loaded with raw
 * bpf(2) and timed with BPF_PROG_TEST_RUN (kernel `duration`, median of 9
 * trials): the bare program, bpf_ktime_get_ns / _coarse_ns / jiffies64, one
 * helper call, ring reserve+submit, stores or bpf_xdp_load_bytes into ring
 * records (and into cache-hot memory), bpf_ringbuf_output from a per-CPU
 * scratch buffer.
 *
 *   gcc -O2 -o /tmp/helper_costs bench/probe/helper_costs.c
 *   sudo /tmp/helper_costs [ring_bytes] [repeat] [drain] [record_bytes] [frame_bytes]
 *   defaults: 67108864 20000 0 2096 342; drain 0 moves the consumer past
 *   the records, 1 copies every record out first.
 *
 * e.g. `... 67108864 20000 0 2096 342` vs `... 67108864 20000 0 432 342`
 * shows what record size does to the cost of the same stores.
 */
#define _GNU_SOURCE
#include <linux/bpf.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <errno.h>
#include <sched.h>

static long bpf(int cmd, union bpf_attr *a) { return syscall(__NR_bpf, cmd, a, sizeof(*a)); }
#define I(code,dst,src,off,imm) ((struct bpf_insn){code,dst,src,off,imm})
#define MOV64I(d,i) I(BPF_ALU64|BPF_MOV|BPF_K,d,0,0,i)
#define MOV64R(d,s) I(BPF_ALU64|BPF_MOV|BPF_X,d,s,0,0)
#define ADD64I(d,i) I(BPF_ALU64|BPF_ADD|BPF_K,d,0,0,i)
#define AND64I(d,i) I(BPF_ALU64|BPF_AND|BPF_K,d,0,0,i)
#define LDXW(d,s,o) I(BPF_LDX|BPF_MEM|BPF_W,d,s,o,0)
#define LDXDW(d,s,o) I(BPF_LDX|BPF_MEM|BPF_DW,d,s,o,0)
#define STXDW(d,s,o) I(BPF_STX|BPF_MEM|BPF_DW,d,s,o,0)
#define STDW(d,o,i) I(BPF_ST|BPF_MEM|BPF_DW,d,0,o,i)
#define CALL(h) I(BPF_JMP|BPF_CALL,0,0,0,h)
#define EXIT I(BPF_JMP|BPF_EXIT,0,0,0,0)
#define JEQI(d,i,o) I(BPF_JMP|BPF_JEQ|BPF_K,d,0,o,i)
#define JGTI(d,i,o) I(BPF_JMP|BPF_JGT|BPF_K,d,0,o,i)
#define JLTI(d,i,o) I(BPF_JMP|BPF_JLT|BPF_K,d,0,o,i)
#define JGTR(d,s,o) I(BPF_JMP|BPF_JGT|BPF_X,d,s,o,0)
#define LDMAP(d,fd) I(BPF_LD|BPF_DW|BPF_IMM,d,BPF_PSEUDO_MAP_FD,0,fd), I(0,0,0,0,0)

static char log_buf[1<<20];
static int load(struct bpf_insn *p, int n, int type) {
  union bpf_attr a; memset(&a,0,sizeof a);
  a.prog_type = type; a.insns=(uint64_t)p; a.insn_cnt=n; a.license=(uint64_t)"GPL";
  a.log_buf=(uint64_t)log_buf; a.log_size=sizeof log_buf; a.log_level=1;
  int fd = bpf(BPF_PROG_LOAD,&a);
  if (fd<0) { fprintf(stderr,"load: %s\n%s\n",strerror(errno),log_buf); exit(1);} return fd;
}
static int rb_fd; static uint64_t rb_size; static volatile uint64_t *cons, *prod; static uint8_t *data;
static void mkring(uint64_t sz) {
  union bpf_attr a; memset(&a,0,sizeof a); a.map_type=BPF_MAP_TYPE_RINGBUF; a.max_entries=sz;
  rb_fd = bpf(BPF_MAP_CREATE,&a); if (rb_fd<0){perror("map");exit(1);} rb_size=sz;
  cons = mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED,rb_fd,0);
  void *p = mmap(0,4096+2*sz,PROT_READ,MAP_SHARED,rb_fd,4096); if(p==MAP_FAILED){perror("mmap");exit(1);}
  prod = p; data = (uint8_t*)p+4096;
}
static uint8_t sink[4096]; static volatile uint64_t chk;
static void drain(int mode) {
  uint64_t pp = __atomic_load_n(prod, __ATOMIC_ACQUIRE);
  if (mode==0) { __atomic_store_n(cons, pp, __ATOMIC_RELEASE); return; }
  uint64_t c = *cons; uint64_t s=0;
  while (c < pp) {
    uint32_t hdr = __atomic_load_n((uint32_t*)(data + (c & (rb_size-1))), __ATOMIC_ACQUIRE);
    uint32_t len = hdr & ~(3u<<30);
    uint8_t *rec = data + (c & (rb_size-1)) + 8;
    if (mode==1) { memcpy(sink, rec, len); s += sink[len-1]; }
    else { s += rec[0]; }
    c += (len + 8 + 7) & ~7ull;
  }
  chk += s;
  __atomic_store_n(cons, c, __ATOMIC_RELEASE);
}
static uint32_t run(int fd, void *d, int dl, uint32_t rep) {
  union bpf_attr a; memset(&a,0,sizeof a);
  a.test.prog_fd=fd; a.test.data_in=(uint64_t)d; a.test.data_size_in=dl; a.test.repeat=rep;
  if (bpf(BPF_PROG_TEST_RUN,&a)) { perror("run"); exit(1);} return a.test.duration;
}
static int cmpu(const void*a,const void*b){ return *(uint32_t*)a < *(uint32_t*)b ? -1 : *(uint32_t*)a > *(uint32_t*)b; }

int main(int argc, char **argv) {
  uint64_t ringsz = argc>1 ? strtoull(argv[1],0,0) : (64<<20);
  uint32_t rep = argc>2 ? atoi(argv[2]) : 20000;
  int dmode = argc>3 ? atoi(argv[3]) : 0;
  int recsz = argc>4 ? atoi(argv[4]) : 2096;
  int flen = argc>5 ? atoi(argv[5]) : 342;
  mkring(ringsz);
  int arr_fd; { union bpf_attr a; memset(&a,0,sizeof a); a.map_type=BPF_MAP_TYPE_ARRAY; a.key_size=4; a.value_size=4096; a.max_entries=1; arr_fd=bpf(BPF_MAP_CREATE,&a); if(arr_fd<0){perror("arr");exit(1);} }
  uint8_t frame[2048]; memset(frame, 0x5a, sizeof frame);
  struct bpf_insn pass[] = { MOV64I(0,2), EXIT };
  struct bpf_insn kt[] = { CALL(BPF_FUNC_ktime_get_ns), MOV64I(0,2), EXIT };
  struct bpf_insn ktc[] = { CALL(160), MOV64I(0,2), EXIT };
  struct bpf_insn rs[] = { MOV64R(6,1), LDMAP(1,rb_fd), MOV64I(2,recsz), MOV64I(3,0), CALL(BPF_FUNC_ringbuf_reserve),
     JEQI(0,0,3), MOV64R(1,0), MOV64I(2,0), CALL(BPF_FUNC_ringbuf_submit), MOV64I(0,2), EXIT };
  struct bpf_insn lb[] = { MOV64R(6,1), MOV64R(1,6), CALL(188 /*xdp_get_buff_len*/), MOV64R(8,0),
     JLTI(8,1,17), JGTI(8,recsz-48,16),
     LDMAP(1,rb_fd), MOV64I(2,recsz), MOV64I(3,0), CALL(BPF_FUNC_ringbuf_reserve),
     JEQI(0,0,10), MOV64R(9,0),
     MOV64R(1,6), MOV64I(2,0), MOV64R(3,9), ADD64I(3,48), MOV64R(4,8), CALL(189),
     MOV64R(1,9), MOV64I(2,0), CALL(BPF_FUNC_ringbuf_submit), MOV64I(0,2), EXIT };
  /* reserve + N constant 8B stores + submit */
  struct bpf_insn st[400]; int n=0;
  st[n++]=MOV64R(6,1); st[n++]=(struct bpf_insn)I(BPF_LD|BPF_DW|BPF_IMM,1,BPF_PSEUDO_MAP_FD,0,rb_fd); st[n++]=I(0,0,0,0,0);
  st[n++]=MOV64I(2,recsz); st[n++]=MOV64I(3,0); st[n++]=CALL(BPF_FUNC_ringbuf_reserve);
  int nst = (flen+7)/8; st[n++]=JEQI(0,0,nst+4); st[n++]=MOV64R(9,0);
  for (int i=0;i<nst;i++) st[n++]=STDW(9,48+8*i,0x12345678);
  st[n++]=MOV64R(1,9); st[n++]=MOV64I(2,0); st[n++]=CALL(BPF_FUNC_ringbuf_submit); st[n++]=MOV64I(0,2); st[n++]=EXIT;
  /* array value dest: r6=ctx; r8=len; lookup key 0 */
  struct bpf_insn la[] = { MOV64R(6,1), MOV64R(1,6), CALL(188), MOV64R(8,0),
     JLTI(8,1,16), JGTI(8,2048,15),
     STDW(10,-8,0), LDMAP(1,arr_fd), MOV64R(2,10), ADD64I(2,-8), CALL(BPF_FUNC_map_lookup_elem),
     JEQI(0,0,7), MOV64R(9,0),
     MOV64R(1,6), MOV64I(2,0), MOV64R(3,9), ADD64I(3,48), MOV64R(4,8), CALL(189),
     MOV64I(0,2), EXIT };
  struct bpf_insn ls[] = { MOV64R(6,1), MOV64R(1,6), CALL(188), MOV64R(8,0),
     JLTI(8,1,7), JGTI(8,400,6),
     MOV64R(1,6), MOV64I(2,0), MOV64R(3,10), ADD64I(3,-400), MOV64R(4,8), CALL(189),
     MOV64I(0,2), EXIT };
  struct bpf_insn sa[400]; int m=0;
  sa[m++]=STDW(10,-8,0); sa[m++]=(struct bpf_insn)I(BPF_LD|BPF_DW|BPF_IMM,1,BPF_PSEUDO_MAP_FD,0,arr_fd); sa[m++]=I(0,0,0,0,0);
  sa[m++]=MOV64R(2,10); sa[m++]=ADD64I(2,-8); sa[m++]=CALL(BPF_FUNC_map_lookup_elem);
  sa[m++]=JEQI(0,0,nst); for (int i=0;i<nst;i++) sa[m++]=STDW(0,48+8*i,0x12345678);
  sa[m++]=MOV64I(0,2); sa[m++]=EXIT;
  struct bpf_insn nh[] = { CALL(7), MOV64I(0,2), EXIT };
  struct bpf_insn jf[] = { CALL(118), MOV64I(0,2), EXIT };
  /* percpu scratch + 43 stores + ringbuf_output(scratch, len) */
  int pc_fd; { union bpf_attr a; memset(&a,0,sizeof a); a.map_type=BPF_MAP_TYPE_PERCPU_ARRAY; a.key_size=4; a.value_size=2048+48; a.max_entries=1; pc_fd=bpf(BPF_MAP_CREATE,&a); if(pc_fd<0){perror("pc");exit(1);} }
  struct bpf_insn ro[400]; int k=0;
  ro[k++]=STDW(10,-8,0); ro[k++]=(struct bpf_insn)I(BPF_LD|BPF_DW|BPF_IMM,1,BPF_PSEUDO_MAP_FD,0,pc_fd); ro[k++]=I(0,0,0,0,0);
  ro[k++]=MOV64R(2,10); ro[k++]=ADD64I(2,-8); ro[k++]=CALL(BPF_FUNC_map_lookup_elem);
  ro[k++]=JEQI(0,0,nst+7); for (int i=0;i<nst;i++) ro[k++]=STDW(0,48+8*i,0x12345678);
  ro[k++]=MOV64R(2,0); ro[k++]=(struct bpf_insn)I(BPF_LD|BPF_DW|BPF_IMM,1,BPF_PSEUDO_MAP_FD,0,rb_fd); ro[k++]=I(0,0,0,0,0);
  ro[k++]=MOV64I(3,recsz); ro[k++]=MOV64I(4,0); ro[k++]=CALL(BPF_FUNC_ringbuf_output);
  ro[k++]=MOV64I(0,2); ro[k++]=EXIT;
  struct bpf_insn rsn[] = { MOV64R(6,1), LDMAP(1,rb_fd), MOV64I(2,recsz), MOV64I(3,0), CALL(BPF_FUNC_ringbuf_reserve),
     JEQI(0,0,3), MOV64R(1,0), MOV64I(2,BPF_RB_NO_WAKEUP), CALL(BPF_FUNC_ringbuf_submit), MOV64I(0,2), EXIT };
  struct { const char *name; struct bpf_insn *p; int n; int ring; } progs[] = {
    {"pass", pass, 2, 0}, {"ktime", kt, 3, 0}, {"ktime_coarse", ktc, 3, 0},
    {"reserve+submit", rs, sizeof rs/sizeof *rs, 1},
    {"+xdp_load_bytes", lb, sizeof lb/sizeof *lb, 1},
    {"+const stores", st, n, 1},
    {"prandom (null helper)", nh, 3, 0},
    {"jiffies64", jf, 3, 0},
    {"percpu+stores+output", ro, k, 1},
    {"reserve+submit nowakeup", rsn, sizeof rsn/sizeof *rsn, 1},
    {"lookup+load_bytes->array", la, sizeof la/sizeof *la, 0},
    {"load_bytes->stack", ls, sizeof ls/sizeof *ls, 0},
    {"lookup+stores->array", sa, m, 0},
  };
  int np = sizeof progs/sizeof *progs; int fds[16];
  for (int i=0;i<np;i++) fds[i]=load(progs[i].p, progs[i].n, BPF_PROG_TYPE_XDP);
  enum {T=9}; uint32_t res[16][T];
  for (int t=0;t<T;t++) for (int i=0;i<np;i++) {
    uint32_t r = progs[i].ring ? rep : 1000000;
    drain(dmode);
    res[i][t] = run(fds[i], frame, flen, r);
    drain(dmode);
  }
  printf("ring %lu rep %u drain %d rec %d frame %d\n", ringsz, rep, dmode, recsz, flen);
  for (int i=0;i<np;i++) { qsort(res[i],T,4,cmpu); printf("  %-26s median %u  min %u max %u\n", progs[i].name, res[i][T/2], res[i][0], res[i][T-1]); }
  return 0;
}
