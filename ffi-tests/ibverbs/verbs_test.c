/* verbs_test.c: exercises the software verbs stand-in (soft_verbs.c, built as libibverbs.so.1)
 * the way a real program uses libibverbs: linked with -libverbs, rdma-core's public header,
 * the inline ibv_post_send/ibv_post_recv/ibv_poll_cq/ibv_query_port helpers.
 * Two processes (fork) each open soft_0, register buffers, create CQ + RC QPs, exchange
 * (lid, qpn, addr, rkey) over pipes, connect INIT -> RTR -> RTS with NCCL-like attributes, then:
 *   1 MiB RDMA WRITE + WRITE WITH IMM (data exact, imm received as RECV_RDMA_WITH_IMM),
 *   RDMA READ of 1 MiB, SEND/RECV both ways, 100 outstanding writes completing in order,
 *   unsignaled writes (one completion for the signaled last), a bad rkey and an out-of-range
 *   address (REM_ACCESS_ERR, then WR_FLUSH_ERR), SOFT_VERBS_FAIL_AFTER=3 (RETRY_EXC_ERR).
 * What NVIDIA's NCCL IB transport does (NVIDIA_IB.md): a QP granting remote write only refuses
 * a READ (REM_ACCESS_ERR); its data pattern (unsignaled WRITE + zero-byte WRITE WITH IMM with
 * no SGE into a receive with no SGE); 256 fifo elements written one by one while the target
 * polls each element's index word, which must never be seen before the words below it; then,
 * locally: every symbol at the version NCCL's dlvsym asks for, its registration flags (remote
 * atomic, relaxed ordering) accepted, on-demand paging EOPNOTSUPP, remote write without local
 * write EINVAL, unreadable memory EFAULT, its dma-buf probe (fd -1) EOPNOTSUPP, ECE
 * EOPNOTSUPP (no SOFT_VERBS_ECE), pkey index 1 EINVAL, and a QP connected to itself (its flush
 * QP) doing a READ.
 * Then, in a fresh process: SOFT_VERBS_PORTS=2 (two ACTIVE ports, distinct LIDs) and
 * SOFT_VERBS_PORT_DOWN_AFTER_MS (IBV_EVENT_PORT_ERR through ibv_get_async_event, ports DOWN);
 * and SOFT_VERBS_LINK_LAYER=eth (RoCE: GID table and types, RTR refused unless addressed by
 * the peer's GID, a write between two QPs connected by GID; soft_verbs_qp_facts giving the
 * sl 3 and traffic class 106 set at RTR, ENOENT for a destroyed or never-given QP number).
 * Then a fresh process forking into two sides with SOFT_VERBS_ECE=0x7 and 0x5: ECE negotiated
 * as NVIDIA's NCCL does (offer 0x7, B accepts 0x5 in INIT before its RTS, A sets 0x5 before its
 * RTR), a write over it exact; ECE set on one end only: writes both ways RETRY_EXC_ERR, nothing
 * lands; ibv_set_ece EINVAL for NULL, another vendor, a comp_mask, or past RTR; a QP with ECE
 * connected to itself; inline sends (max_inline_data 64 reported by create and query, a
 * 48-byte IBV_SEND_INLINE write from an unregistered stack buffer lands, 65 bytes EINVAL with
 * bad_wr, max_inline_data 1024 refused with EINVAL); soft_verbs_qp_facts: ECE wire options
 * (0x5, or 0 when never set), sl 5, traffic class 0 for a non-global address, max_inline.
 * Then two more pairs of fresh processes, with SOFT_VERBS_IB_SUBNET 1 and 0x2, then 1 and 1:
 * gid_tbl_len 2, GID 0 unchanged, GID 1 in NVIDIA's routable layout (FLID, subnet, GID 0's
 * GUID; type IB for ibv_query_gid_ex), FLIDs distinct, a global RTR from sgid_index 2 EINVAL;
 * across the subnets a write addressed as NVIDIA's NCCL does (global, the peer's FLID and GID
 * 1) lands exactly, while plain LID routing, a global address by LID and the FLID with GID 0
 * complete with RETRY_EXC_ERR and land nothing; within subnet 1 the LID, the FLID and a global
 * address by LID land exactly, a global address to a GID of no port is refused.
 * soft_verbs_qp_facts is looked up with dlvsym (SOFT_VERBS_TEST); built against rdma-core's
 * library (run.sh's verbs_test_real) those checks are skipped.
 * Not tested here: iova registration, SEND larger than the receive (LOC_LEN_ERR).
 * Prints "ok"/"FAIL" lines and "N passed, M failed"; exits non-zero on any failure. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1u << 20)
#define NQP 6 /* 0 main, 1 bad rkey, 2 out of range, 3 fail-after, 4 unsignaled, 5 write-only */
#define FIFO_OFF (3 * MIB + MIB / 2) /* the target's fifo: 256 elements of 64 bytes */
#define FIFO_N 256

static int passed, failed;
static const char *who = "?";

static void check(int cond, const char *what) {
  if (cond) {
    passed++;
    printf("ok    [%s] %s\n", who, what);
  } else {
    failed++;
    printf("FAIL  [%s] %s\n", who, what);
  }
  fflush(stdout);
}

static void die(const char *what) {
  printf("FAIL  [%s] fatal: %s\n", who, what);
  fflush(stdout);
  exit(2);
}

/* An RC QP on `pd` with both queues on `cq`, `depth` work requests each way and room for
 * `max_inline` bytes of inline data; NULL (errno set) if refused. The caps the QP got in *got
 * (if not NULL). */
static struct ibv_qp *rc_qp_inline(struct ibv_pd *pd, struct ibv_cq *cq, int depth,
                                   uint32_t max_inline, struct ibv_qp_cap *got) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = depth;
  ia.cap.max_recv_wr = depth;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = max_inline;
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  if (got) *got = ia.cap;
  return qp;
}

/* An RC QP on `pd` with both queues on `cq`, `depth` work requests each way. */
static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq, int depth) {
  struct ibv_qp *qp = rc_qp_inline(pd, cq, depth, 0, NULL);
  if (!qp) die("ibv_create_qp");
  return qp;
}

/* The stand-in's test query soft_verbs_qp_facts, looked up at run time (never linked: the
 * verbs_test_real build against rdma-core's library has no such symbol); NULL, saying so, when
 * the library lacks it. */
typedef int (*qp_facts_fn)(uint32_t qp_num, uint32_t *traffic_class, uint32_t *service_level,
                           uint32_t *ece_options, uint32_t *max_inline);
static qp_facts_fn qp_facts(void) {
  qp_facts_fn f = (qp_facts_fn)dlvsym(RTLD_DEFAULT, "soft_verbs_qp_facts", "SOFT_VERBS_TEST");
  if (!f) printf("      [%s] no soft_verbs_qp_facts@SOFT_VERBS_TEST: its checks skipped\n", who);
  return f;
}

/* Move `qp` to INIT on port 1 with remote `access`. */
static void to_init(struct ibv_qp *qp, int access) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("modify INIT");
}

/* What ibv_modify_qp changes to move a QP to RTR, as NCCL's IB transport does. */
#define RTR_MASK                                                                               \
  (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |               \
   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)

/* RTR attributes towards QP dest_qpn as NCCL sets them (MTU 4096, receive PSN 0, one read in
 * flight, RNR timer 12) on port 1; the address is the caller's to fill. */
static struct ibv_qp_attr rtr_attr(uint32_t dest_qpn) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = 1;
  return a;
}

/* Move `qp` to RTS with the attributes NCCL uses (send PSN 0). */
static void to_rts(struct ibv_qp *qp) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  a.timeout = 20;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    die("modify RTS");
}

struct info {
  uint16_t lid;
  uint32_t qpn[NQP];
  uint64_t buf;
  uint32_t rkey;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp[NQP];
static struct ibv_mr *mr;
static char *buf; /* [0, 4 MiB): 0..1M write target, 1..2M read source, 2..3M local scratch */
static int wfd, rfd;

/* The end of a pair of processes (fork_pair): side B prints its counts as `name` and
 * exits with them; side A waits for it, checks it ended cleanly, and answers its own. */
static int end_pair(int side_b, pid_t pid, const char *name) {
  if (side_b) {
    printf("%s: %d passed, %d failed\n", name, passed, failed);
    fflush(stdout);
    return failed ? 1 : 0;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "side B exited cleanly with no failures");
  return failed ? 1 : 0;
}

/* The first device of a freshly read list, opened (dies where there is none). */
static struct ibv_context *open_first_device(void) {
  struct ibv_device **list = ibv_get_device_list(NULL);
  if (!list || !list[0]) die("no device");
  struct ibv_context *c = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!c) die("ibv_open_device");
  return c;
}

/* ctx, pd, cq on the first device, and `bytes` of zeroed buffer registered for local and
 * remote writes as mr. */
static void open_with_buffer(size_t bytes) {
  ctx = open_first_device();
  pd = ibv_alloc_pd(ctx);
  cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
  buf = aligned_alloc(4096, bytes);
  if (!cq || !buf) die("pd, cq, buffer");
  memset(buf, 0, bytes);
  mr = ibv_reg_mr(pd, buf, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) die("ibv_reg_mr");
}

static void put(const void *p, size_t n) {
  if (write(wfd, p, n) != (ssize_t)n) die("pipe write");
}
static void get(void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(rfd, (char *)p + got, n - got);
    if (r <= 0) die("pipe read");
    got += (size_t)r;
  }
}
/* Forks a peer joined to this process by two pipes (put/get): the parent is `parent`, the
 * child `child` in the lines each prints. fork's answer; -1 when the pipes or fork fail. */
static pid_t fork_pair(const char *parent, const char *child) {
  int p2c[2], c2p[2];
  if (pipe(p2c) || pipe(c2p)) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return -1;
  int is_child = pid == 0;
  who = is_child ? child : parent;
  wfd = is_child ? c2p[1] : p2c[1];
  rfd = is_child ? p2c[0] : c2p[0];
  return pid;
}

static void sync_with_peer(char tag) {
  char c;
  put(&tag, 1);
  get(&c, 1);
  if (c != tag) die("out of step with the peer");
}

/* Polls c until n completions arrived (or 10 s). */
static int poll_cq_n(struct ibv_cq *c, struct ibv_wc *wc, int n) {
  int got = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (got < n) {
    int r = ibv_poll_cq(c, n - got, wc + got);
    if (r < 0) return got;
    got += r;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 10) break;
    if (!r) usleep(100);
  }
  return got;
}

static int poll_n(struct ibv_wc *wc, int n) { return poll_cq_n(cq, wc, n); }

/* A one-SGE RDMA work request `op` of sge to (raddr, rkey) with `flags`. */
static void fill_rdma(struct ibv_send_wr *wr, enum ibv_wr_opcode op, uint64_t wr_id,
                      struct ibv_sge *sge, uint64_t raddr, uint32_t rkey, unsigned flags) {
  memset(wr, 0, sizeof *wr);
  wr->wr_id = wr_id;
  wr->sg_list = sge;
  wr->num_sge = 1;
  wr->opcode = op;
  wr->send_flags = flags;
  wr->wr.rdma.remote_addr = raddr;
  wr->wr.rdma.rkey = rkey;
}

static int post_rdma(int q, enum ibv_wr_opcode op, uint64_t wr_id, size_t loff, uint32_t len,
                     uint64_t raddr, uint32_t rkey, int signaled, uint32_t imm) {
  struct ibv_sge sge = {(uint64_t)(uintptr_t)(buf + loff), len, mr->lkey};
  struct ibv_send_wr wr, *bad;
  fill_rdma(&wr, op, wr_id, &sge, raddr, rkey, signaled ? IBV_SEND_SIGNALED : 0);
  wr.imm_data = htonl(imm);
  return ibv_post_send(qp[q], &wr, &bad);
}

static int post_recv(int q, uint64_t wr_id, size_t off, uint32_t len) {
  struct ibv_sge sge = {(uint64_t)(uintptr_t)(buf + off), len, mr->lkey};
  struct ibv_recv_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = len ? 1 : 0;
  return ibv_post_recv(qp[q], &wr, &bad);
}

static void setup(struct info *me) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  check(list && n == 1 && strcmp(ibv_get_device_name(list[0]), "soft_0") == 0,
        "one device named soft_0");
  if (!list || n < 1) die("no device");
  check(ibv_get_device_guid(list[0]) != 0, "device GUID is set");
  ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) die("ibv_open_device");
  struct ibv_device_attr da;
  check(ibv_query_device(ctx, &da) == 0 && da.phys_port_cnt == 1 && da.max_qp_wr >= 256,
        "ibv_query_device: 1 port, max_qp_wr >= 256");
  struct ibv_port_attr pa;
  check(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
            pa.link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid != 0 &&
            pa.active_width == 2 /* 4X */ && pa.active_speed == 32 /* EDR */,
        "ibv_query_port: ACTIVE, InfiniBand, LID set, 4X EDR for SOFT_VERBS_RATE_GBPS=100");
  check(ibv_query_port(ctx, 2, &pa) != 0, "ibv_query_port: no port 2");
  union ibv_gid gid;
  check(ibv_query_gid(ctx, 1, 0, &gid) == 0 && gid.raw[0] == 0xfe && gid.raw[1] == 0x80,
        "ibv_query_gid: link-local prefix");
  __be16 pkey;
  check(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htons(0xffff), "ibv_query_pkey");
  ibv_query_port(ctx, 1, &pa);
  me->lid = pa.lid;
  pd = ibv_alloc_pd(ctx);
  if (!pd) die("ibv_alloc_pd");
  buf = aligned_alloc(4096, 4 * MIB);
  if (!buf) die("alloc");
  memset(buf, 0, 4 * MIB);
  mr = ibv_reg_mr(pd, buf, 4 * MIB,
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  check(mr != NULL && mr->lkey && mr->rkey, "ibv_reg_mr: keys");
  if (!mr) die("ibv_reg_mr");
  check(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL,
        "ibv_reg_dmabuf_mr is refused (not emulated)");
  cq = ibv_create_cq(ctx, 1024, NULL, NULL, 0);
  if (!cq) die("ibv_create_cq");
  for (int i = 0; i < NQP; i++) {
    if (i == 3) setenv("SOFT_VERBS_FAIL_AFTER", "3", 1);
    qp[i] = rc_qp(pd, cq, 256);
    if (i == 3) unsetenv("SOFT_VERBS_FAIL_AFTER");
    me->qpn[i] = qp[i]->qp_num;
    /* QP 5 as NCCL's sending QPs: remote write only. */
    to_init(qp[i], i == 5 ? IBV_ACCESS_REMOTE_WRITE
                          : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  }
  me->buf = (uint64_t)(uintptr_t)buf;
  me->rkey = mr->rkey;
}

static void connect_qps(const struct info *peer) {
  for (int i = 0; i < NQP; i++) {
    struct ibv_qp_attr a = rtr_attr(peer->qpn[i]);
    a.ah_attr.dlid = peer->lid;
    if (ibv_modify_qp(qp[i], &a, RTR_MASK)) die("modify RTR");
  }
  sync_with_peer('r'); /* both RTR before either sends (as NCCL's handshake guarantees) */
  for (int i = 0; i < NQP; i++) to_rts(qp[i]);
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  check(ibv_query_qp(qp[0], &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi) == 0 &&
            qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == peer->qpn[0] &&
            qa.ah_attr.dlid == peer->lid && qa.path_mtu == IBV_MTU_4096,
        "ibv_query_qp: RTS, dest_qp_num, dlid, path_mtu");
  sync_with_peer('s');
}

static uint8_t pat(size_t i, int seed) { return (uint8_t)(i * 131 + (i >> 13) + (size_t)seed); }

/* Rank 0: the requester of every operation except one send. */
static void rank0(const struct info *peer) {
  struct ibv_wc wc[128];
  /* 1 MiB write, then write-with-imm of 4 KiB into [1M-4K... no: into offset 3M of the peer */
  for (size_t i = 0; i < MIB; i++) buf[2 * MIB + i] = (char)pat(i, 1);
  check(post_rdma(0, IBV_WR_RDMA_WRITE, 1, 2 * MIB, MIB, peer->buf, peer->rkey, 1, 0) == 0 &&
            post_rdma(0, IBV_WR_RDMA_WRITE_WITH_IMM, 2, 2 * MIB, 4096, peer->buf + 3 * MIB,
                      peer->rkey, 1, 0x12345678) == 0,
        "post 1 MiB RDMA WRITE + WRITE WITH IMM");
  int n = poll_n(wc, 2);
  check(n == 2 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 1 &&
            wc[0].opcode == IBV_WC_RDMA_WRITE && wc[1].status == IBV_WC_SUCCESS &&
            wc[1].wr_id == 2,
        "write completions, in order");
  sync_with_peer('1'); /* peer checked the data and the immediate */

  /* RDMA READ 1 MiB of the peer's [1M, 2M) into our [2M, 3M) */
  check(post_rdma(0, IBV_WR_RDMA_READ, 3, 2 * MIB, MIB, peer->buf + MIB, peer->rkey, 1, 0) == 0,
        "post RDMA READ");
  n = poll_n(wc, 1);
  int same = 1;
  for (size_t i = 0; i < MIB && same; i++) same = (uint8_t)buf[2 * MIB + i] == pat(i, 2);
  check(n == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RDMA_READ &&
            wc[0].byte_len == MIB && same,
        "RDMA READ: 1 MiB exact");

  /* SEND 1000 bytes to the peer; receive its 777-byte SEND WITH IMM */
  post_recv(0, 50, 3 * MIB, 4096);
  sync_with_peer('2'); /* both receives posted */
  memset(buf + 2 * MIB, 0x5a, 1000);
  check(post_rdma(0, IBV_WR_SEND, 4, 2 * MIB, 1000, 0, 0, 1, 0) == 0, "post SEND");
  n = poll_n(wc, 2);
  int sent = 0, rcvd = 0;
  for (int i = 0; i < n; i++) {
    if (wc[i].wr_id == 4 && wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_SEND) sent = 1;
    if (wc[i].wr_id == 50 && wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV &&
        wc[i].byte_len == 777 && (wc[i].wc_flags & IBV_WC_WITH_IMM) &&
        ntohl(wc[i].imm_data) == 0xabcdef && (uint8_t)buf[3 * MIB + 776] == 0xa5)
      rcvd = 1;
  }
  check(n == 2 && sent, "SEND completes");
  check(rcvd, "RECV of the peer's SEND WITH IMM: length, immediate, data");
  sync_with_peer('3');

  /* 100 outstanding 8 KiB writes, completing in order; the last carries an immediate */
  for (size_t i = 0; i < MIB; i++) buf[2 * MIB + i] = (char)pat(i, 3);
  int rc = 0;
  for (int i = 0; i < 100; i++)
    rc |= post_rdma(0, i == 99 ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE, 100 + (uint64_t)i,
                    2 * MIB + (size_t)i * 8192, 8192, peer->buf + (uint64_t)i * 8192, peer->rkey,
                    1, 99);
  check(rc == 0, "post 100 writes back to back");
  n = poll_n(wc, 100);
  int inorder = n == 100;
  for (int i = 0; i < n && inorder; i++)
    inorder = wc[i].wr_id == 100 + (uint64_t)i && wc[i].status == IBV_WC_SUCCESS;
  check(inorder, "100 outstanding writes complete in order");
  sync_with_peer('4');

  /* unsignaled: 10 writes, only the last signaled -> exactly one completion */
  rc = 0;
  for (int i = 0; i < 10; i++)
    rc |= post_rdma(4, IBV_WR_RDMA_WRITE, 200 + (uint64_t)i, 2 * MIB, 4096, peer->buf, peer->rkey,
                    i == 9, 0);
  n = poll_n(wc, 1);
  usleep(20000);
  int extra = ibv_poll_cq(cq, 8, wc + 1);
  check(rc == 0 && n == 1 && wc[0].wr_id == 209 && wc[0].status == IBV_WC_SUCCESS && extra == 0,
        "unsignaled writes: one completion, for the signaled last");

  /* bad rkey on QP 1: REM_ACCESS_ERR, then the QP is in error and flushes */
  post_rdma(1, IBV_WR_RDMA_WRITE, 300, 2 * MIB, 4096, peer->buf, peer->rkey ^ 0x5a5a0000, 1, 0);
  n = poll_n(wc, 1);
  check(n == 1 && wc[0].wr_id == 300 && wc[0].status == IBV_WC_REM_ACCESS_ERR,
        "bad rkey: IBV_WC_REM_ACCESS_ERR");
  post_rdma(1, IBV_WR_RDMA_WRITE, 301, 2 * MIB, 4096, peer->buf, peer->rkey, 0, 0);
  n = poll_n(wc, 1);
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  ibv_query_qp(qp[1], &qa, IBV_QP_STATE, &qi);
  check(n == 1 && wc[0].wr_id == 301 && wc[0].status == IBV_WC_WR_FLUSH_ERR &&
            qa.qp_state == IBV_QPS_ERR,
        "after the error: QP in ERR, next WR (even unsignaled) flushed");

  /* out of range on QP 2: a read past the end of the peer's MR */
  post_rdma(2, IBV_WR_RDMA_READ, 400, 2 * MIB, 8192, peer->buf + 4 * MIB - 4096, peer->rkey, 1, 0);
  n = poll_n(wc, 1);
  check(n == 1 && wc[0].wr_id == 400 && wc[0].status == IBV_WC_REM_ACCESS_ERR,
        "address beyond the MR: IBV_WC_REM_ACCESS_ERR");

  /* SOFT_VERBS_FAIL_AFTER=3 on QP 3: writes 1..3 succeed, 4 retry-exceeded, 5 flushed */
  rc = 0;
  for (int i = 0; i < 5; i++)
    rc |= post_rdma(3, IBV_WR_RDMA_WRITE, 500 + (uint64_t)i, 2 * MIB, 4096,
                    peer->buf + (uint64_t)i * 4096, peer->rkey, 1, 0);
  n = poll_n(wc, 5);
  check(rc == 0 && n == 5 && wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS &&
            wc[2].status == IBV_WC_SUCCESS && wc[3].wr_id == 503 &&
            wc[3].status == IBV_WC_RETRY_EXC_ERR && wc[4].wr_id == 504 &&
            wc[4].status == IBV_WC_WR_FLUSH_ERR,
        "SOFT_VERBS_FAIL_AFTER=3: 3 writes succeed, the 4th RETRY_EXC_ERR, the 5th flushed");
  sync_with_peer('5');

  /* QP 5 grants remote write only (NCCL's sending QPs): a READ from it is refused */
  post_rdma(5, IBV_WR_RDMA_READ, 550, 2 * MIB, 4096, peer->buf + MIB, peer->rkey, 1, 0);
  n = poll_n(wc, 1);
  check(n == 1 && wc[0].wr_id == 550 && wc[0].status == IBV_WC_REM_ACCESS_ERR,
        "READ from a QP granting remote write only: IBV_WC_REM_ACCESS_ERR");

  /* NCCL's send: the data as an unsignaled WRITE, then a zero-byte WRITE WITH IMM with no SGE
   * (sg_list NULL) carrying the size, signaled */
  for (size_t i = 0; i < 65536; i++) buf[2 * MIB + i] = (char)pat(i, 6);
  sync_with_peer('6'); /* the peer's receive without SGE is posted */
  rc = post_rdma(0, IBV_WR_RDMA_WRITE, 600, 2 * MIB, 65536, peer->buf, peer->rkey, 0, 0);
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 601;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = 65536; /* NCCL passes the size in host order */
  wr.wr.rdma.remote_addr = peer->buf + 65536;
  wr.wr.rdma.rkey = peer->rkey;
  rc |= ibv_post_send(qp[0], &wr, &bad);
  n = poll_n(wc, 1);
  check(rc == 0 && n == 1 && wc[0].wr_id == 601 && wc[0].status == IBV_WC_SUCCESS &&
            wc[0].opcode == IBV_WC_RDMA_WRITE,
        "NCCL's send: unsignaled WRITE + zero-byte WRITE WITH IMM, one completion");
  sync_with_peer('7');

  /* NCCL's fifo: 64-byte elements written one by one, words 0-4 then the index (word 5) */
  uint64_t *el = (uint64_t *)(void *)(buf + 2 * MIB);
  for (int i = 0; i < FIFO_N; i++) {
    for (int k = 0; k < 8; k++) el[i * 8 + k] = k < 5 ? (uint64_t)i * 5 + (uint64_t)k + 1 : 0;
    el[i * 8 + 5] = (uint64_t)i + 1;
  }
  sync_with_peer('8'); /* the peer polls */
  rc = 0;
  for (int i = 0; i < FIFO_N; i++)
    rc |= post_rdma(0, IBV_WR_RDMA_WRITE, 700 + (uint64_t)i, 2 * MIB + (size_t)i * 64, 64,
                    peer->buf + FIFO_OFF + (uint64_t)i * 64, peer->rkey, i == FIFO_N - 1, 0);
  n = poll_n(wc, 1);
  check(rc == 0 && n == 1 && wc[0].status == IBV_WC_SUCCESS, "256 fifo elements written");
  sync_with_peer('9');
}

/* What NVIDIA's NCCL does to the device alone (NVIDIA_IB.md), on this process's device. */
static void local_checks(void) {
  /* the entry points, at the versions its dlvsym asks for */
  static const char *const v11[] = {
      "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
      "ibv_close_device",    "ibv_get_async_event",  "ibv_ack_async_event", "ibv_query_device",
      "ibv_query_port",      "ibv_query_gid",        "ibv_query_qp",        "ibv_alloc_pd",
      "ibv_dealloc_pd",      "ibv_reg_mr",           "ibv_dereg_mr",        "ibv_create_cq",
      "ibv_destroy_cq",      "ibv_create_qp",        "ibv_modify_qp",       "ibv_destroy_qp",
      "ibv_fork_init",       "ibv_event_type_str"};
  static const char *const opt[][2] = {{"ibv_reg_mr_iova2", "IBVERBS_1.8"},
                                       {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"},
                                       {"ibv_query_ece", "IBVERBS_1.10"},
                                       {"ibv_set_ece", "IBVERBS_1.10"}};
  void *h = dlopen("libibverbs.so", RTLD_NOW);
  if (!h) h = dlopen("libibverbs.so.1", RTLD_NOW);
  int missing = h ? 0 : 1;
  for (size_t i = 0; h && i < sizeof v11 / sizeof v11[0]; i++)
    if (!dlvsym(h, v11[i], "IBVERBS_1.1")) {
      printf("      missing %s@IBVERBS_1.1\n", v11[i]);
      missing++;
    }
  for (size_t i = 0; h && i < sizeof opt / sizeof opt[0]; i++)
    if (!dlvsym(h, opt[i][0], opt[i][1])) {
      printf("      missing %s@%s\n", opt[i][0], opt[i][1]);
      missing++;
    }
  check(!missing, "dlvsym: NCCL's 22 entry points at IBVERBS_1.1 and its 4 optional ones");

  /* registration: NCCL's flags; what a device without the feature answers */
  int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
              IBV_ACCESS_REMOTE_ATOMIC;
  char *m = aligned_alloc(4096, 65536);
  if (!m) die("alloc");
  struct ibv_mr *a = ibv_reg_mr(pd, m, 65536, flags);
  struct ibv_mr *b = ibv_reg_mr_iova2(pd, m, 65536, (uint64_t)(uintptr_t)m,
                                      (unsigned)flags | IBV_ACCESS_RELAXED_ORDERING);
  check(a && b, "NCCL's registration: remote atomic access, relaxed ordering through iova2");
  if (a) ibv_dereg_mr(a);
  if (b) ibv_dereg_mr(b);
  errno = 0;
  check(ibv_reg_mr(pd, m, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) == NULL &&
            errno == EOPNOTSUPP,
        "on-demand paging: EOPNOTSUPP");
  errno = 0;
  check(ibv_reg_mr(pd, m, 65536, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
        "remote write without local write: EINVAL");
  void *none = mmap(NULL, 65536, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  errno = 0;
  check(none != MAP_FAILED && ibv_reg_mr(pd, none, 65536, IBV_ACCESS_LOCAL_WRITE) == NULL &&
            errno == EFAULT,
        "memory the process cannot read (as GPU memory): EFAULT");
  if (none != MAP_FAILED) munmap(none, 65536);
  errno = 0;
  check(ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0) == NULL && errno == EOPNOTSUPP,
        "NCCL's dma-buf probe (fd -1): EOPNOTSUPP, not EBADF");
  struct ibv_ece ece;
  memset(&ece, 0, sizeof ece);
  check(ibv_query_ece(qp[0], &ece) == EOPNOTSUPP && ibv_set_ece(qp[0], &ece) == EOPNOTSUPP,
        "ibv_query_ece/ibv_set_ece: EOPNOTSUPP without SOFT_VERBS_ECE");

  /* NCCL's flush QP: connected to itself, an RDMA READ of one byte into a host int */
  struct ibv_cq *c2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = c2;
  ia.recv_cq = c2;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *self = c2 ? ibv_create_qp(pd, &ia) : NULL;
  if (!self) die("flush QP");
  struct ibv_qp_attr at;
  memset(&at, 0, sizeof at);
  at.qp_state = IBV_QPS_INIT;
  at.pkey_index = 1;
  at.port_num = 1;
  at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  check(ibv_modify_qp(self, &at, mask) == EINVAL, "pkey index 1 (one-entry table): EINVAL");
  at.pkey_index = 0;
  int rc = ibv_modify_qp(self, &at, mask);
  struct ibv_port_attr pa;
  ibv_query_port(ctx, 1, &pa);
  at = rtr_attr(self->qp_num);
  at.ah_attr.dlid = pa.lid;
  rc |= ibv_modify_qp(self, &at, RTR_MASK);
  memset(&at, 0, sizeof at);
  at.qp_state = IBV_QPS_RTS;
  at.timeout = 20;
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 1;
  rc |= ibv_modify_qp(self, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  int *flush = aligned_alloc(64, 64);
  if (!flush) die("alloc");
  *flush = 0;
  struct ibv_mr *fm = ibv_reg_mr(pd, flush, sizeof(int), IBV_ACCESS_LOCAL_WRITE);
  buf[MIB + 5] = 0x3c;
  struct ibv_sge sge = {(uint64_t)(uintptr_t)flush, 1, fm ? fm->lkey : 0};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 800;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)(buf + MIB + 5);
  wr.wr.rdma.rkey = mr->rkey;
  rc |= !fm || ibv_post_send(self, &wr, &bad);
  struct ibv_wc wc;
  int n = poll_cq_n(c2, &wc, 1);
  check(rc == 0 && n == 1 && wc.wr_id == 800 && wc.status == IBV_WC_SUCCESS &&
            wc.opcode == IBV_WC_RDMA_READ && (*flush & 0xff) == 0x3c,
        "a QP connected to itself (NCCL's flush): 1-byte RDMA READ");
  ibv_destroy_qp(self);
  if (fm) ibv_dereg_mr(fm);
  ibv_destroy_cq(c2);
  free(flush);
  free(m);
}

/* Rank 1: the target; also sends once. */
static void rank1(const struct info *peer) {
  struct ibv_wc wc[128];
  (void)peer;
  for (size_t i = 0; i < MIB; i++) buf[MIB + i] = (char)pat(i, 2); /* READ source */
  post_recv(0, 10, 0, 0);                                          /* for the imm */
  int n = poll_n(wc, 1);
  int same = 1;
  for (size_t i = 0; i < MIB && same; i++) same = (uint8_t)buf[i] == pat(i, 1);
  for (size_t i = 0; i < 4096 && same; i++) same = (uint8_t)buf[3 * MIB + i] == pat(i, 1);
  check(n == 1 && wc[0].wr_id == 10 && wc[0].status == IBV_WC_SUCCESS &&
            wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc[0].wc_flags & IBV_WC_WITH_IMM) &&
            ntohl(wc[0].imm_data) == 0x12345678 && wc[0].byte_len == 4096,
        "WRITE WITH IMM consumed a receive: RECV_RDMA_WITH_IMM, immediate 0x12345678");
  check(same, "1 MiB RDMA WRITE landed exactly, before the immediate");
  sync_with_peer('1');

  post_recv(0, 20, 2 * MIB, 4096);
  sync_with_peer('2');
  memset(buf + 3 * MIB, 0xa5, 777);
  struct ibv_sge sge = {(uint64_t)(uintptr_t)(buf + 3 * MIB), 777, mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 21;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(0xabcdef);
  check(ibv_post_send(qp[0], &wr, &bad) == 0, "post SEND WITH IMM");
  n = poll_n(wc, 2);
  int rcvd = 0, sent = 0;
  for (int i = 0; i < n; i++) {
    if (wc[i].wr_id == 20 && wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV &&
        wc[i].byte_len == 1000 && !(wc[i].wc_flags & IBV_WC_WITH_IMM) &&
        (uint8_t)buf[2 * MIB + 999] == 0x5a && wc[i].src_qp == peer->qpn[0])
      rcvd = 1;
    if (wc[i].wr_id == 21 && wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_SEND) sent = 1;
  }
  check(rcvd, "RECV: 1000 bytes from the peer's SEND, src_qp");
  check(sent, "SEND WITH IMM completes");
  sync_with_peer('3');

  post_recv(0, 30, 0, 0);
  n = poll_n(wc, 1);
  same = 1;
  for (size_t i = 0; i < 100 * 8192 && same; i++) same = (uint8_t)buf[i] == pat(i, 3);
  check(n == 1 && wc[0].wr_id == 30 && ntohl(wc[0].imm_data) == 99 && same,
        "100 writes: all data landed before the final immediate");
  sync_with_peer('4');
  sync_with_peer('5');
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  ibv_query_qp(qp[1], &qa, IBV_QP_STATE, &qi);
  check(qa.qp_state == IBV_QPS_ERR, "the responder of the bad-rkey QP went to ERR too");

  /* NCCL's receive: no SGE; the data came by the WRITE before the immediate */
  struct ibv_recv_wr rw, *rbad;
  memset(&rw, 0, sizeof rw);
  rw.wr_id = 60;
  check(ibv_post_recv(qp[0], &rw, &rbad) == 0, "post a receive with no SGE (NCCL's)");
  sync_with_peer('6');
  n = poll_n(wc, 1);
  same = 1;
  for (size_t i = 0; i < 65536 && same; i++) same = (uint8_t)buf[i] == pat(i, 6);
  check(n == 1 && wc[0].wr_id == 60 && wc[0].status == IBV_WC_SUCCESS &&
            wc[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc[0].imm_data == 65536 &&
            wc[0].byte_len == 0 && same,
        "zero-byte WRITE WITH IMM: RECV_RDMA_WITH_IMM, the size as immediate, data before it");
  sync_with_peer('7');

  /* the fifo: an element's index word is never seen before the words below it */
  volatile uint64_t *f = (volatile uint64_t *)(void *)(buf + FIFO_OFF);
  sync_with_peer('8');
  int seen = 0, torn = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < FIFO_N; i++) {
    while (f[i * 8 + 5] != (uint64_t)i + 1) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if (t.tv_sec - t0.tv_sec > 10) break;
    }
    if (f[i * 8 + 5] != (uint64_t)i + 1) break;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    for (int k = 0; k < 5; k++) torn += f[i * 8 + k] != (uint64_t)i * 5 + (uint64_t)k + 1;
    seen++;
  }
  check(seen == FIFO_N && torn == 0,
        "256 fifo elements polled by their index word: never seen before the words below it");
  sync_with_peer('9');
}

/* Moves q to RTR towards QP dest_qpn (of this process) over RoCE, addressed as given, with
 * service level 3 and traffic class 106 (NCCL_IB_TC's usual value). */
static int roce_rtr(struct ibv_qp *q, uint32_t dest_qpn, int global, int sgid_index,
                    const union ibv_gid *dgid) {
  struct ibv_qp_attr a = rtr_attr(dest_qpn);
  a.ah_attr.is_global = (uint8_t)global;
  a.ah_attr.grh.dgid = *dgid;
  a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.grh.traffic_class = 106;
  a.ah_attr.sl = 3;
  return ibv_modify_qp(q, &a, RTR_MASK);
}

/* A fresh process with SOFT_VERBS_LINK_LAYER=eth: a RoCE port's GID table and types, RTR
 * refused without a global address or with a wrong GID, then two QPs of the process
 * connected by GID moving 64 KiB. */
static int roce_check(void) {
  who = "roce";
  setenv("SOFT_VERBS_LINK_LAYER", "eth", 1);
  struct ibv_context *c = open_first_device();
  struct ibv_port_attr pa;
  check(ibv_query_port(c, 1, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_ETHERNET &&
            pa.lid == 0 && pa.gid_tbl_len == 4,
        "eth: link layer Ethernet, LID 0, 4 GIDs");
  struct ibv_gid_entry e[4];
  int types_ok = 1;
  for (int i = 0; i < 4; i++)
    types_ok &= ibv_query_gid_ex(c, 1, (uint32_t)i, &e[i], 0) == 0 &&
                e[i].gid_type == (i & 1 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1);
  check(types_ok, "eth: GID types RoCE v1, v2, v1, v2");
  static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  check(types_ok && e[0].gid.raw[0] == 0xfe && e[0].gid.raw[1] == 0x80 &&
            !memcmp(&e[0].gid, &e[1].gid, 16) && !memcmp(e[2].gid.raw, v4, 12) &&
            e[2].gid.raw[12] == 10 && !memcmp(&e[2].gid, &e[3].gid, 16),
        "eth: GIDs 0, 1 link-local; 2, 3 IPv4-mapped 10.x.y.z");
  union ibv_gid g;
  struct ibv_gid_entry none;
  check(ibv_query_gid(c, 1, 4, &g) != 0 && ibv_query_gid_ex(c, 1, 4, &none, 0) != 0,
        "eth: no GID index 4");
  struct ibv_pd *p = ibv_alloc_pd(c);
  struct ibv_cq *q = p ? ibv_create_cq(c, 64, NULL, NULL, 0) : NULL;
  char *b = aligned_alloc(4096, 2 * 65536);
  if (!q || !b) die("pd, cq, buffer");
  struct ibv_mr *m = ibv_reg_mr(p, b, 2 * 65536,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!m) die("ibv_reg_mr");
  struct ibv_qp *qa[2];
  for (int i = 0; i < 2; i++) {
    qa[i] = rc_qp(p, q, 16);
    to_init(qa[i], IBV_ACCESS_REMOTE_WRITE);
  }
  union ibv_gid other = e[3].gid;
  other.raw[15] ^= 1; /* another process's LID */
  check(roce_rtr(qa[0], qa[1]->qp_num, 0, 3, &e[3].gid) == EINVAL,
        "eth: RTR with a non-global address is EINVAL");
  check(roce_rtr(qa[0], qa[1]->qp_num, 1, 3, &e[1].gid) == EINVAL,
        "eth: RTR with the GID of another index than sgid_index is EINVAL");
  check(roce_rtr(qa[0], qa[1]->qp_num, 1, 3, &other) == EINVAL,
        "eth: RTR with a dgid not of the destination QP's process is EINVAL");
  check(roce_rtr(qa[0], qa[1]->qp_num, 1, 4, &e[3].gid) == EINVAL,
        "eth: RTR with sgid_index past the table is EINVAL");
  check(roce_rtr(qa[0], qa[1]->qp_num, 1, 3, &e[3].gid) == 0 &&
            roce_rtr(qa[1], qa[0]->qp_num, 1, 3, &e[3].gid) == 0,
        "eth: RTR with the peer's GID at sgid_index 3");
  qp_facts_fn facts = qp_facts();
  if (facts) {
    uint32_t tc = 0, sl = 0, ece = 1, inl = 1;
    check(facts(qa[0]->qp_num, &tc, &sl, &ece, &inl) == 0 && tc == 106 && sl == 3 && ece == 0 &&
              inl == 0 && facts(qa[1]->qp_num, NULL, NULL, NULL, NULL) == 0,
          "soft_verbs_qp_facts: traffic class 106 and sl 3 set at RTR, no ECE, no inline");
  }
  for (int i = 0; i < 2; i++) to_rts(qa[i]);
  for (int i = 0; i < 65536; i++) b[i] = (char)pat((size_t)i, 7);
  memset(b + 65536, 0, 65536);
  struct ibv_sge sge = {(uint64_t)(uintptr_t)b, 65536, m->lkey};
  struct ibv_send_wr wr, *bad;
  fill_rdma(&wr, IBV_WR_RDMA_WRITE, 1, &sge, (uint64_t)(uintptr_t)(b + 65536), m->rkey,
            IBV_SEND_SIGNALED);
  struct ibv_wc wc;
  check(ibv_post_send(qa[0], &wr, &bad) == 0 && poll_cq_n(q, &wc, 1) == 1 &&
            wc.status == IBV_WC_SUCCESS && !memcmp(b, b + 65536, 65536),
        "eth: 64 KiB RDMA WRITE over the GID-addressed QPs, exact");
  uint32_t gone = qa[0]->qp_num;
  for (int i = 0; i < 2; i++) ibv_destroy_qp(qa[i]);
  if (facts) {
    uint32_t tc = 7;
    check(facts(gone, &tc, NULL, NULL, NULL) == ENOENT && tc == 7 &&
              facts(gone & ~0x3ffu, NULL, NULL, NULL, NULL) == ENOENT,
          "soft_verbs_qp_facts: ENOENT for a destroyed QP and a number never given");
  }
  ibv_dereg_mr(m);
  ibv_destroy_cq(q);
  ibv_dealloc_pd(p);
  ibv_close_device(c);
  free(b);
  return failed ? 1 : 0;
}

/* A fresh process: two ports, then both go down with an async event each. */
static int port_down_check(void) {
  who = "ports";
  setenv("SOFT_VERBS_PORTS", "2", 1);
  setenv("SOFT_VERBS_RATE_GBPS", "200", 1);
  setenv("SOFT_VERBS_PORT_DOWN_AFTER_MS", "100", 1);
  struct ibv_context *c = open_first_device();
  struct ibv_device_attr da;
  struct ibv_port_attr p1, p2;
  check(ibv_query_device(c, &da) == 0 && da.phys_port_cnt == 2, "SOFT_VERBS_PORTS=2: two ports");
  check(ibv_query_port(c, 1, &p1) == 0 && ibv_query_port(c, 2, &p2) == 0 &&
            p1.state == IBV_PORT_ACTIVE && p2.state == IBV_PORT_ACTIVE && p1.lid != p2.lid &&
            p1.active_width == 2 && p1.active_speed == 64 /* HDR */,
        "both ports ACTIVE, distinct LIDs, 4X HDR for 200 Gb/s");
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < 2; i++) {
    struct ibv_async_event ev;
    if (ibv_get_async_event(c, &ev)) break;
    if (ev.event_type == IBV_EVENT_PORT_ERR && ev.element.port_num >= 1 &&
        ev.element.port_num <= 2)
      seen[ev.element.port_num] = 1;
    ibv_ack_async_event(&ev);
  }
  check(seen[1] && seen[2], "SOFT_VERBS_PORT_DOWN_AFTER_MS: IBV_EVENT_PORT_ERR for each port");
  check(ibv_query_port(c, 1, &p1) == 0 && p1.state == IBV_PORT_DOWN, "the port is DOWN after");
  ibv_close_device(c);
  return failed ? 1 : 0;
}

/* ---- ECE and inline sends: two fresh processes with different SOFT_VERBS_ECE ---- */

#define ECE_NQP 3 /* 0 negotiated as NCCL does, 1 ECE set on side B only, 2 legacy + inline */
#define ECE_BUF 65536

struct ece_info {
  uint16_t lid;
  uint32_t qpn[ECE_NQP];
  uint64_t buf;
  uint32_t rkey;
  struct ibv_ece ece; /* A: its QP 0's offer; B: what its QP 0 accepted */
};

static int ece_query(struct ibv_qp *q, uint32_t *options) {
  struct ibv_ece e;
  memset(&e, 0xff, sizeof e);
  int rc = ibv_query_ece(q, &e);
  *options = e.options;
  return rc || e.vendor_id != 0x15b3 || e.comp_mask != 0;
}

/* Moves q to RTR towards QP dqpn at dlid (service level 5; a traffic class that a non-global
 * address does not carry), then to RTS. */
static void ib_connect(struct ibv_qp *q, uint16_t dlid, uint32_t dqpn) {
  struct ibv_qp_attr a = rtr_attr(dqpn);
  a.ah_attr.dlid = dlid;
  a.ah_attr.sl = 5;
  a.ah_attr.grh.traffic_class = 99; /* ignored: not global */
  if (ibv_modify_qp(q, &a, RTR_MASK)) die("modify RTR");
  to_rts(q);
}

static void ece_connect(const struct ece_info *peer) {
  for (int i = 0; i < ECE_NQP; i++) ib_connect(qp[i], peer->lid, peer->qpn[i]);
}

/* A QP of side A connected to itself with ECE set (accepting all of A's 0x7): the rule holds
 * within one process too, so its write goes through. */
static void ece_self(const struct ece_info *me) {
  struct ibv_qp *q = rc_qp(pd, cq, 16);
  to_init(q, IBV_ACCESS_REMOTE_WRITE);
  struct ibv_ece all = {0x15b3, 0xffffffffu, 0};
  uint32_t opt = 0;
  check(ibv_set_ece(q, &all) == 0 && ece_query(q, &opt) == 0 && opt == 0x7,
        "ibv_set_ece of all options on side A accepts its 0x7");
  ib_connect(q, me->lid, q->qp_num);
  for (int i = 0; i < 256; i++) buf[32768 + i] = (char)i;
  struct ibv_sge sge = {(uint64_t)(uintptr_t)(buf + 32768), 256, mr->lkey};
  struct ibv_send_wr wr, *badwr;
  fill_rdma(&wr, IBV_WR_RDMA_WRITE, 6, &sge, (uint64_t)(uintptr_t)(buf + 40960), mr->rkey,
            IBV_SEND_SIGNALED);
  struct ibv_wc wc;
  check(ibv_post_send(q, &wr, &badwr) == 0 && poll_n(&wc, 1) == 1 && wc.wr_id == 6 &&
            wc.status == IBV_WC_SUCCESS && !memcmp(buf + 32768, buf + 40960, 256),
        "a QP with ECE 0x7 connected to itself: RDMA WRITE exact");
  ibv_destroy_qp(q);
}

/* Side A (SOFT_VERBS_ECE=0x7): offers, then takes B's answer before its RTR; the requester of
 * the data checks; then a QP of its own connected to itself. */
static void ece_side_a(struct ece_info *me) {
  struct ece_info peer;
  uint32_t opt = 0;
  check(ece_query(qp[0], &opt) == 0 && opt == 0x7,
        "SOFT_VERBS_ECE=0x7: ibv_query_ece offers {0x15b3, 0x7, 0}");
  struct ibv_ece bad = {0x02c9, 0x7, 0};
  struct ibv_ece comp = {0x15b3, 0x7, 1};
  errno = 0;
  check(ibv_set_ece(qp[2], NULL) == EINVAL && ibv_set_ece(qp[2], &bad) == EINVAL &&
            errno == EINVAL && ibv_set_ece(qp[2], &comp) == EINVAL,
        "ibv_set_ece: NULL, another vendor id, a comp_mask: EINVAL");
  memset(&me->ece, 0, sizeof me->ece);
  ibv_query_ece(qp[0], &me->ece);
  put(me, sizeof *me);
  get(&peer, sizeof peer);
  check(ibv_set_ece(qp[0], &peer.ece) == 0 && ece_query(qp[0], &opt) == 0 && opt == 0x5,
        "ibv_set_ece of B's answer (0x5) in INIT; ibv_query_ece then gives 0x5");
  ece_connect(&peer);
  struct ibv_ece late = {0x15b3, 0x7, 0};
  check(ibv_set_ece(qp[0], &late) == EINVAL && ece_query(qp[0], &opt) == 0 && opt == 0x5,
        "ibv_set_ece past RTR: EINVAL, options unchanged");
  sync_with_peer('c'); /* both sides RTS */

  struct ibv_wc wc[2];
  for (int i = 0; i < 4096; i++) buf[i] = (char)pat((size_t)i, 9);
  int rc = post_rdma(0, IBV_WR_RDMA_WRITE, 1, 0, 4096, peer.buf, peer.rkey, 1, 0);
  check(rc == 0 && poll_n(wc, 1) == 1 && wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS,
        "ECE 0x5 on both ends: RDMA WRITE completes");
  rc = post_rdma(1, IBV_WR_RDMA_WRITE, 2, 0, 4096, peer.buf + 8192, peer.rkey, 1, 0);
  check(rc == 0 && poll_n(wc, 1) == 1 && wc[0].wr_id == 2 &&
            wc[0].status == IBV_WC_RETRY_EXC_ERR,
        "ECE set on the target only: the write completes with RETRY_EXC_ERR");

  /* inline: 48 bytes from an unregistered stack buffer, no lkey */
  char small[65];
  for (int i = 0; i < 65; i++) small[i] = (char)(0x40 + i);
  struct ibv_sge sge = {(uint64_t)(uintptr_t)small, 48, 0};
  struct ibv_send_wr wr, *badwr = NULL;
  fill_rdma(&wr, IBV_WR_RDMA_WRITE, 3, &sge, peer.buf + 16384, peer.rkey,
            IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  rc = ibv_post_send(qp[2], &wr, &badwr);
  memset(small, 0, 48); /* inline: the data was taken at post time */
  check(rc == 0 && poll_n(wc, 1) == 1 && wc[0].wr_id == 3 && wc[0].status == IBV_WC_SUCCESS,
        "inline 48-byte write (max_inline_data 64) from an unregistered stack buffer, lkey 0");
  sge.length = 65;
  wr.wr_id = 4;
  badwr = NULL;
  check(ibv_post_send(qp[2], &wr, &badwr) == EINVAL && badwr == &wr &&
            ibv_poll_cq(cq, 1, wc) == 0,
        "inline 65-byte write past max_inline_data 64: EINVAL, bad_wr, nothing posted");
  sync_with_peer('w'); /* B checks what landed */
  ece_self(me);
}

/* Side B (SOFT_VERBS_ECE=0x5): answers A's offer with what it accepts, before A's RTR. */
static void ece_side_b(struct ece_info *me) {
  struct ece_info peer;
  uint32_t opt = 0;
  get(&peer, sizeof peer);
  check(ibv_set_ece(qp[0], &peer.ece) == 0 && ece_query(qp[0], &opt) == 0 && opt == 0x5,
        "SOFT_VERBS_ECE=0x5: ibv_set_ece of A's offer 0x7 accepts 0x5");
  check(ibv_set_ece(qp[1], &peer.ece) == 0, "ibv_set_ece on QP 1 (A leaves its QP 1 legacy)");
  ece_connect(&peer); /* RTS, connecting to A's QPs still in INIT */
  check(ece_query(qp[0], &opt) == 0 && opt == 0x5, "ibv_query_ece at RTS: 0x5");
  memset(&me->ece, 0, sizeof me->ece);
  ibv_query_ece(qp[0], &me->ece);
  put(me, sizeof *me);
  sync_with_peer('c');
  struct ibv_wc wc[1];
  int rc = post_rdma(1, IBV_WR_RDMA_WRITE, 5, 0, 64, peer.buf, peer.rkey, 1, 0);
  check(rc == 0 && poll_n(wc, 1) == 1 && wc[0].wr_id == 5 &&
            wc[0].status == IBV_WC_RETRY_EXC_ERR,
        "ECE set on the requester only: the write completes with RETRY_EXC_ERR");
  sync_with_peer('w');
  int same = 1;
  for (int i = 0; i < 4096 && same; i++) same = (uint8_t)buf[i] == pat((size_t)i, 9);
  check(same, "the write over the ECE 0x5 connection landed exactly");
  int zero = 1;
  for (int i = 8192; i < 8192 + 4096 && zero; i++) zero = buf[i] == 0;
  check(zero, "nothing landed through the refused connection");
  same = 1;
  for (int i = 0; i < 48 && same; i++) same = buf[16384 + i] == (char)(0x40 + i);
  check(same && buf[16384 + 48] == 0, "the inline write's 48 bytes landed exactly");
}

/* A fresh process that forks, before either side opens the device, into side A
 * (SOFT_VERBS_ECE=0x7) and side B (0x5), each with three QPs towards the other's: QP 0
 * negotiates ECE as NVIDIA's NCCL does (A offers, B sets A's offer in INIT and answers what it
 * accepted after its RTS, A sets that before its RTR); QP 1 has ECE set on B only, a mismatch
 * both directions refuse; QP 2 is legacy (no ECE) with max_inline_data 64, for inline sends. */
static int ece_check(void) {
  pid_t pid = fork_pair("ece-a", "ece-b");
  if (pid < 0) return 2;
  int side_b = pid == 0;
  setenv("SOFT_VERBS_ECE", side_b ? "0x5" : "0x7", 1);
  open_with_buffer(ECE_BUF);
  struct ibv_qp_cap got;
  errno = 0;
  check(rc_qp_inline(pd, cq, 16, 1024, NULL) == NULL && errno == EINVAL,
        "max_inline_data 1024 (above 256): ibv_create_qp fails with EINVAL");
  struct ece_info me;
  memset(&me, 0, sizeof me);
  for (int i = 0; i < ECE_NQP; i++) {
    qp[i] = rc_qp_inline(pd, cq, 16, i == 2 ? 64 : 0, &got);
    if (!qp[i]) die("ibv_create_qp");
    to_init(qp[i], IBV_ACCESS_REMOTE_WRITE);
    me.qpn[i] = qp[i]->qp_num;
  }
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  check(got.max_inline_data == 64 && ibv_query_qp(qp[2], &qa, IBV_QP_CAP, &qi) == 0 &&
            qa.cap.max_inline_data == 64 && qi.cap.max_inline_data == 64,
        "max_inline_data 64: reported by ibv_create_qp and ibv_query_qp");
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa)) die("ibv_query_port");
  me.lid = pa.lid;
  me.buf = (uint64_t)(uintptr_t)buf;
  me.rkey = mr->rkey;
  if (side_b) ece_side_b(&me); else ece_side_a(&me);

  qp_facts_fn facts = qp_facts();
  if (facts) {
    uint32_t f[ECE_NQP][4];
    int rc = 0;
    for (int i = 0; i < ECE_NQP; i++)
      rc |= facts(qp[i]->qp_num, &f[i][0], &f[i][1], &f[i][2], &f[i][3]);
    check(rc == 0 && f[0][0] == 0 && f[0][1] == 5 && f[0][2] == 0x5 && f[0][3] == 0,
          "soft_verbs_qp_facts: negotiated QP has ECE 0x5, sl 5, traffic class 0 (not global)");
    check(f[1][2] == (side_b ? 0x5u : 0u) && f[2][2] == 0 && f[2][3] == 64,
          "soft_verbs_qp_facts: ECE wire options 0 when never set, max_inline 64");
  }
  sync_with_peer('e');
  for (int i = 0; i < ECE_NQP; i++) ibv_destroy_qp(qp[i]);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  free(buf);
  return end_pair(side_b, pid, "ece-b");
}

/* ---- InfiniBand subnets: two fresh processes with SOFT_VERBS_IB_SUBNET ---- */

#define SN_NQP 4
#define SN_SRC 32768 /* where a side's writes come from; the peer's land at [0, SN_NQP * 4096) */

struct sn_info {
  uint16_t lid;
  uint32_t qpn[SN_NQP];
  uint64_t buf;
  uint32_t rkey;
  union ibv_gid gid[2]; /* port 1's GIDs 0 and 1 */
};

/* How a QP addresses its peer: by LID; as NVIDIA across subnets (global, the FLID of the
 * peer's GID 1, that GID); global by LID to GID 1 (a GRH within a subnet); global to the FLID
 * but with GID 0; global by LID to a GID of no port. */
enum { SN_LID, SN_FLID, SN_LID_GRH, SN_FLID_GID0, SN_LID_NO_GID };

static uint16_t gid_flid(const union ibv_gid *g) { return (uint16_t)(g->raw[4] << 8 | g->raw[5]); }

/* Moves q to RTR towards the peer's QP i, addressed as `how`, from GID `sgid_index`. */
static int sn_rtr(struct ibv_qp *q, const struct sn_info *peer, int i, int how, int sgid_index) {
  struct ibv_qp_attr a = rtr_attr(peer->qpn[i]);
  a.ah_attr.dlid = how == SN_FLID || how == SN_FLID_GID0 ? gid_flid(&peer->gid[1]) : peer->lid;
  if (how != SN_LID) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid[how == SN_FLID_GID0 ? 0 : 1];
    if (how == SN_LID_NO_GID) a.ah_attr.grh.dgid.raw[15] ^= 0x5a;
    a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
    a.ah_attr.grh.hop_limit = 255;
  }
  return ibv_modify_qp(q, &a, RTR_MASK);
}

/* A fresh process that forks into sides A and B before either opens the device: A with
 * SOFT_VERBS_IB_SUBNET=1, B with 0x2 (or 1 too when `same`). Each checks its port's GID table
 * (gid_tbl_len 2, GID 1 = fe80:0000:<FLID>:<subnet>:<GID 0's GUID>), then connects SN_NQP QPs
 * to the other's, addressed as below, and writes 4 KiB over each: across the two subnets only
 * NVIDIA's global address to the peer's FLID and GID 1 reaches the peer, plain LID routing
 * and the other addresses complete with IBV_WC_RETRY_EXC_ERR; within subnet 1, the LID, the
 * FLID and a GRH by LID all do, a GID of no port does not. What lands is checked. */
static int subnet_check(int same) {
  static const int cross_how[SN_NQP] = {SN_FLID, SN_LID, SN_LID_GRH, SN_FLID_GID0};
  static const int same_how[SN_NQP] = {SN_LID, SN_FLID, SN_LID_GRH, SN_LID_NO_GID};
  static const char *const name[] = {
      "plain LID routing", "global to the peer's FLID and GID 1 (NVIDIA's)",
      "global by LID to the peer's GID 1", "global to the peer's FLID with its GID 0",
      "global by LID to a GID of no port"};
  const int *how = same ? same_how : cross_how;
  pid_t pid = fork_pair(same ? "sn1-a" : "sn-a", same ? "sn1-b" : "sn-b");
  if (pid < 0) return 2;
  int side_b = pid == 0;
  uint16_t subnet = side_b && !same ? 2 : 1;
  setenv("SOFT_VERBS_IB_SUBNET", side_b && !same ? "0x2" : "1", 1);
  const char *pair = same ? "both on subnet 1" : "subnets 1 and 2";
  char what[200];
  open_with_buffer(65536);

  struct sn_info me, peer;
  memset(&me, 0, sizeof me);
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa)) die("ibv_query_port");
  me.lid = pa.lid;
  union ibv_gid none;
  struct ibv_gid_entry ge;
  check(pa.gid_tbl_len == 2 && ibv_query_gid(ctx, 1, 0, &me.gid[0]) == 0 &&
            ibv_query_gid(ctx, 1, 1, &me.gid[1]) == 0 && ibv_query_gid(ctx, 1, 2, &none) != 0,
        "SOFT_VERBS_IB_SUBNET: gid_tbl_len 2, GIDs 0 and 1, no GID 2");
  static const uint8_t zero[8];
  const uint8_t *g0 = me.gid[0].raw, *g1 = me.gid[1].raw;
  check(g0[0] == 0xfe && g0[1] == 0x80 && !memcmp(g0 + 2, zero, 6),
        "GID 0 is still the link-local fe80::<guid> (no FLID, subnet 0)");
  uint16_t flid = gid_flid(&me.gid[1]);
  snprintf(what, sizeof what,
           "GID 1 = fe80:0000:<FLID>:<subnet %u>:<GID 0's GUID>, FLID 0x%x nonzero, not the "
           "LID 0x%x",
           (unsigned)subnet, (unsigned)flid, (unsigned)pa.lid);
  check(g1[0] == 0xfe && g1[1] == 0x80 && g1[2] == 0 && g1[3] == 0 && flid != 0 &&
            flid != pa.lid && g1[6] == subnet >> 8 && g1[7] == (subnet & 0xff) &&
            !memcmp(g1 + 8, g0 + 8, 8),
        what);
  memset(&ge, 0, sizeof ge);
  check(ibv_query_gid_ex(ctx, 1, 1, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_IB &&
            ge.gid_index == 1 && !memcmp(&ge.gid, &me.gid[1], sizeof ge.gid),
        "ibv_query_gid_ex: GID 1, type IB");

  for (int i = 0; i < SN_NQP; i++) {
    qp[i] = rc_qp(pd, cq, 16);
    to_init(qp[i], IBV_ACCESS_REMOTE_WRITE);
    me.qpn[i] = qp[i]->qp_num;
  }
  me.buf = (uint64_t)(uintptr_t)buf;
  me.rkey = mr->rkey;
  put(&me, sizeof me);
  get(&peer, sizeof peer);
  check(gid_flid(&peer.gid[1]) != flid && peer.gid[1].raw[7] == (same ? 1 : 3 - subnet),
        "the peer's FLID differs; its GID 1 carries its subnet");

  check(sn_rtr(qp[0], &peer, 0, SN_FLID, 2) == EINVAL,
        "RTR, global from sgid_index 2 (past gid_tbl_len 2): EINVAL");
  for (int i = 0; i < SN_NQP; i++) {
    if (sn_rtr(qp[i], &peer, i, how[i], 1)) die("modify RTR");
    to_rts(qp[i]);
  }
  sync_with_peer('c'); /* both sides RTS */
  int seed = side_b ? 40 : 30;
  for (int i = 0; i < SN_NQP; i++) {
    int works = same ? how[i] != SN_LID_NO_GID : how[i] == SN_FLID;
    for (int k = 0; k < 4096; k++) buf[SN_SRC + i * 4096 + k] = (char)pat((size_t)k, seed + i);
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    int rc = post_rdma(i, IBV_WR_RDMA_WRITE, 10 + (uint64_t)i, SN_SRC + (size_t)i * 4096, 4096,
                       peer.buf + (uint64_t)i * 4096, peer.rkey, 1, 0);
    int n = poll_n(&wc, 1);
    snprintf(what, sizeof what, "%s, %s: the write %s", pair, name[how[i]],
             works ? "completes" : "completes with IBV_WC_RETRY_EXC_ERR");
    check(rc == 0 && n == 1 && wc.wr_id == 10 + (uint64_t)i &&
              wc.status == (works ? IBV_WC_SUCCESS : IBV_WC_RETRY_EXC_ERR),
          what);
  }
  sync_with_peer('w'); /* both sides' writes are done */
  int peer_seed = side_b ? 30 : 40;
  for (int i = 0; i < SN_NQP; i++) {
    int works = same ? how[i] != SN_LID_NO_GID : how[i] == SN_FLID;
    int ok = 1;
    for (int k = 0; k < 4096 && ok; k++)
      ok = (uint8_t)buf[i * 4096 + k] == (works ? pat((size_t)k, peer_seed + i) : 0);
    snprintf(what, sizeof what, "%s, %s: %s", pair, name[how[i]],
             works ? "the peer's write landed exactly" : "nothing landed");
    check(ok, what);
  }
  sync_with_peer('e');
  for (int i = 0; i < SN_NQP; i++) ibv_destroy_qp(qp[i]);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  free(buf);
  return end_pair(side_b, pid, who);
}

/* Runs this program again with `mode` (exec: the library's process state must start fresh);
 * whether it exited with 0. */
static int run_fresh(const char *self, const char *mode) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", self, mode, (char *)NULL);
    _exit(3);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "ports") == 0) return port_down_check();
  if (argc > 1 && strcmp(argv[1], "roce") == 0) return roce_check();
  if (argc > 1 && strcmp(argv[1], "ece") == 0) return ece_check();
  if (argc > 1 && strcmp(argv[1], "subnets") == 0) return subnet_check(0);
  if (argc > 1 && strcmp(argv[1], "subnet1") == 0) return subnet_check(1);
  setenv("SOFT_VERBS_RATE_GBPS", "100", 1);
  pid_t pid = fork_pair("rank0", "rank1");
  if (pid < 0) return 2;
  int rank = pid == 0;
  struct info me, peer;
  memset(&me, 0, sizeof me);
  setup(&me);
  put(&me, sizeof me);
  get(&peer, sizeof peer);
  check(peer.lid != me.lid && peer.qpn[0] != me.qpn[0], "distinct LIDs and QP numbers");
  connect_qps(&peer);
  if (rank == 0) rank0(&peer); else rank1(&peer);
  if (rank == 0) local_checks();
  sync_with_peer('e');
  for (int i = 0; i < NQP; i++) ibv_destroy_qp(qp[i]);
  ibv_destroy_cq(cq);
  check(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0,
        "teardown");
  if (rank == 1) {
    printf("rank1: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  int child_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  check(child_ok, "rank1 exited cleanly with no failures");
  check(run_fresh(argv[0], "ports"), "port checks in a fresh process");
  check(run_fresh(argv[0], "roce"), "RoCE checks in a fresh process");
  check(run_fresh(argv[0], "ece"), "ECE and inline checks in two fresh processes");
  check(run_fresh(argv[0], "subnets"), "IB subnets 1 and 2 (routable FLIDs), two fresh processes");
  check(run_fresh(argv[0], "subnet1"), "IB subnet 1 on both ends in two fresh processes");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
