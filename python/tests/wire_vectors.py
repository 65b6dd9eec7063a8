"""The test vectors of docs/design/wire-protocol.md ("Test vectors"), copied verbatim.

Each is a whole handshake or frame in hex; ``#`` starts a comment that runs to the end of the
line. ``test_codec.py`` checks that these copies still equal the specification's when the
repository is present, so a change to the protocol cannot leave this client behind silently.
"""

VECTORS = {
    "hello": """
53 54 52 41   # magic "STRA"
06 00         # version 6
00 00         # status OK
""",
    "hello-version-mismatch": """
53 54 52 41   # magic "STRA"
06 00         # the server's version, 6
10 00         # status 16 PROTOCOL_VERSION_MISMATCH
""",
    "ping-request": """
0c 00 00 00               # frame length 12
01                        # kind: request
00                        # flags
01 00                     # opcode 1 PING
01 00 00 00 00 00 00 00   # request id 1
""",
    "ping-response": """
0e 00 00 00               # frame length 14
02                        # kind: response
00                        # flags
01 00                     # opcode 1 PING
01 00 00 00 00 00 00 00   # request id 1
00 00                     # status OK
""",
    "read-request": """
24 00 00 00               # frame length 36
01 00                     # kind: request, flags
1e 00                     # opcode 30 READ
02 00 00 00 00 00 00 00   # request id 2
01 00 00 00 00 00 00 00   # table id 1
05 00                     # key length 5
68 65 6c 6c 6f            # "hello"
05 00 00 00 00 00 00 00   # rules: given version 5
08                        # rules: flags, bit 3 version_ne_given
""",
    "read-response-ok": """
27 00 00 00               # frame length 39
02 00                     # kind: response, flags
1e 00                     # opcode 30 READ
02 00 00 00 00 00 00 00   # request id 2
00 00                     # status OK
05 00 00 00 00 00 00 00   # version 5
05 00 00 00               # value length 5
77 6f 72 6c 64            # "world"
dc 05 00 00 00 00 00 00   # expires in 1 500 ms
""",
    "read-response-object-doesnt-exist": """
22 00 00 00               # frame length 34
02 00                     # kind: response, flags
1e 00                     # opcode 30 READ
03 00 00 00 00 00 00 00   # request id 3
03 00                     # status 3 OBJECT_DOESNT_EXIST
00 00 00 00 00 00 00 00   # version 0
00 00 00 00               # value length 0
00 00 00 00 00 00 00 00   # no expiry
""",
    "write-request": """
48 00 00 00               # frame length 72
01 00                     # kind: request, flags
1f 00                     # opcode 31 WRITE
04 00 00 00 00 00 00 00   # request id 4
01 00 00 00 00 00 00 00   # table id 1
01 00 6b                  # key length 1, "k"
02 00 00 00 76 31         # value length 2, "v1"
00 00 00 00 00 00 00 00   # rules: given version 0
02                        # rules: flags, bit 1 exists
02                        # expiry: after milliseconds
60 ea 00 00 00 00 00 00   # 60 000 ms
01                        # rpc identity: present
07 00 00 00 00 00 00 00   #   lease 7
0c 00 00 00 00 00 00 00   #   rpc 12
0a 00 00 00 00 00 00 00   #   acknowledged 10
""",
    "increment-response": """
1e 00 00 00               # frame length 30
02 00                     # kind: response, flags
21 00                     # opcode 33 INCREMENT
05 00 00 00 00 00 00 00   # request id 5
00 00                     # status OK
09 00 00 00 00 00 00 00   # version 9
fe ff ff ff ff ff ff ff   # value -2
""",
    "multi-write-request": """
57 00 00 00               # frame length 87
01 00                     # kind: request, flags
23 00                     # opcode 35 MULTI_WRITE
06 00 00 00 00 00 00 00   # request id 6
02 00 00 00               # 2 items
01 00 00 00 00 00 00 00   # item 1: table id 1
01 00 61                  #   key "a"
01 00 00 00 78            #   value "x"
00 00 00 00 00 00 00 00   #   rules: given version 0
00                        #   rules: no flags
00                        #   expiry: never
00 00 00 00 00 00 00 00   #   (no time)
00                        #   no rpc identity
02 00 00 00 00 00 00 00   # item 2: table id 2
01 00 62                  #   key "b"
02 00 00 00 79 7a         #   value "yz"
03 00 00 00 00 00 00 00   #   rules: given version 3
08                        #   rules: bit 3 version_ne_given
01                        #   expiry: keep the current object's
00 00 00 00 00 00 00 00   #   (no time)
00                        #   no rpc identity
""",
    "enumerate-request": """
34 00 00 00               # frame length 52
01 00                     # kind: request, flags
26 00                     # opcode 38 ENUMERATE
07 00 00 00 00 00 00 00   # request id 7
01 00 00 00 00 00 00 00   # table id 1
00 00 00 00 00 00 00 00   # range start 0
ff ff ff ff ff ff ff ff   # range end 2^64 - 1
00 00 00 00 00 00 00 80   # cursor: reversed hash 2^63
01                        # cursor: has after-key
01 00 6b                  # cursor: after-key "k"
00 00 01 00               # bytes max 65536
""",
    "create-table-request": """
18 00 00 00               # frame length 24
01 00                     # kind: request, flags
0c 00                     # opcode 12 CREATE_TABLE
08 00 00 00 00 00 00 00   # request id 8
05 00 75 73 65 72 73      # name "users"
04 00 00 00               # server span 4
01                        # tier 1 flash
""",
    "list-tables-response": """
3b 00 00 00               # frame length 59
02 00                     # kind: response, flags
0f 00                     # opcode 15 LIST_TABLES
1b 00 00 00 00 00 00 00   # request id 27
00 00                     # status OK
02 00 00 00               # tables: 2
05 00 75 73 65 72 73      #   name "users"
01 00 00 00 00 00 00 00   #   table id 1
02 00 00 00               #   tablet count 2
00                        #   tier 0 memory
06 00 65 76 65 6e 74 73   #   name "events"
02 00 00 00 00 00 00 00   #   table id 2
01 00 00 00               #   tablet count 1
01                        #   tier 1 flash
""",
    "split-tablet-request": """
1b 00 00 00               # frame length 27
01 00                     # kind: request, flags
15 00                     # opcode 21 SPLIT_TABLET
0a 00 00 00 00 00 00 00   # request id 10
05 00 75 73 65 72 73      # name "users"
00 00 00 00 00 00 00 80   # split hash 2^63
""",
    "take-tablet-ownership-request": """
35 00 00 00               # frame length 53
01 00                     # kind: request, flags
28 00                     # opcode 40 TAKE_TABLET_OWNERSHIP
1a 00 00 00 00 00 00 00   # request id 26
05 00 00 00 00 00 00 00   # master id 5
01 00 00 00 00 00 00 00   # table id 1
00 00 00 00 00 00 00 00   # range start 0
ff ff ff ff ff ff ff 7f   # range end 0x7fffffffffffffff
08 00 00 00 00 00 00 00   # assignment epoch 8
01                        # tier 1 flash
""",
    "get-tablet-map-response": """
74 00 00 00               # frame length 116
02 00                     # kind: response, flags
10 00                     # opcode 16 GET_TABLET_MAP
09 00 00 00 00 00 00 00   # request id 9
00 00                     # status OK
02 00 00 00               # 2 tablets
01 00 00 00 00 00 00 00   # tablet 1: table id 1
00 00 00 00 00 00 00 00   #   range start 0
ff ff ff ff ff ff ff 7f   #   range end 2^63 - 1
01 00 00 00 00 00 00 00   #   owner server id 1
0e 00                     #   owner address length 14
31 30 2e 30 2e 30 2e 31 3a 31 31 31 30 30   # "10.0.0.1:11100"
00                        #   state normal
01 00 00 00 00 00 00 00   # tablet 2: table id 1
00 00 00 00 00 00 00 80   #   range start 2^63
ff ff ff ff ff ff ff ff   #   range end 2^64 - 1
02 00 00 00 00 00 00 00   #   owner server id 2
0e 00                     #   owner address length 14
31 30 2e 30 2e 30 2e 32 3a 31 31 31 30 30   # "10.0.0.2:11100"
01                        #   state recovering
""",
    "error-response-unknown-tablet": """
20 00 00 00               # frame length 32
02 00                     # kind: response, flags
1e 00                     # opcode 30 READ
0a 00 00 00 00 00 00 00   # request id 10
01 00                     # status 1 UNKNOWN_TABLET
10 00                     # message length 16
74 61 62 6c 65 74 20 6e 6f 74 20 6f 77 6e 65 64   # "tablet not owned"
""",
    "backup-write-request": """
39 00 00 00               # frame length 57
01 00                     # kind: request, flags
32 00                     # opcode 50 BACKUP_WRITE
0b 00 00 00 00 00 00 00   # request id 11
02 00 00 00 00 00 00 00   # master id 2
03 00 00 00 00 00 00 00   # segment id 3
01 00 00 00 00 00 00 00   # epoch 1
00 00 00 00               # offset 0
05                        # flags: bit 0 open, bit 2 primary
04 00 00 00               # certificate: segment length 4
0d 0c 0b 0a               # certificate: checksum 0x0a0b0c0d
04 00 00 00               # data length 4
01 20 53 47               # data
""",
    "backup-write-response-open-rejected": """
26 00 00 00               # frame length 38
02 00                     # kind: response, flags
32 00                     # opcode 50 BACKUP_WRITE
0b 00 00 00 00 00 00 00   # request id 11
15 00                     # status 21 BACKUP_OPEN_REJECTED
16 00                     # message length 22
6e 6f 20 72 65 70 6c 69 63 61 20 62 75 66 66 65 72 20 66 72 65 65   # "no replica buffer free"
""",
    "backup-free-request": """
1c 00 00 00               # frame length 28
01 00                     # kind: request, flags
33 00                     # opcode 51 BACKUP_FREE
0c 00 00 00 00 00 00 00   # request id 12
02 00 00 00 00 00 00 00   # master id 2
03 00 00 00 00 00 00 00   # segment id 3
""",
    "backup-list-replicas-request": """
14 00 00 00               # frame length 20
01 00                     # kind: request, flags
34 00                     # opcode 52 BACKUP_LIST_REPLICAS
0d 00 00 00 00 00 00 00   # request id 13
02 00 00 00 00 00 00 00   # master id 2
""",
    "backup-list-replicas-response": """
54 00 00 00               # frame length 84
02 00                     # kind: response, flags
34 00                     # opcode 52 BACKUP_LIST_REPLICAS
0d 00 00 00 00 00 00 00   # request id 13
00 00                     # status OK
02 00 00 00               # 2 replicas
02 00 00 00 00 00 00 00   # replica 1: master id 2
03 00 00 00 00 00 00 00   #   segment id 3
01 00 00 00 00 00 00 00   #   epoch 1
6d 00 00 00               #   certificate: segment length 109
f4 93 82 e5               #   certificate: checksum 0xe58293f4
03                        #   flags: bit 0 closed, bit 1 primary
02 00 00 00 00 00 00 00   # replica 2: master id 2
04 00 00 00 00 00 00 00   #   segment id 4
02 00 00 00 00 00 00 00   #   epoch 2
40 00 00 00               #   certificate: segment length 64
04 03 02 01               #   certificate: checksum 0x01020304
00                        #   flags: open, not primary
""",
    "backup-read-replica-request": """
1c 00 00 00               # frame length 28
01 00                     # kind: request, flags
35 00                     # opcode 53 BACKUP_READ_REPLICA
0e 00 00 00 00 00 00 00   # request id 14
02 00 00 00 00 00 00 00   # master id 2
03 00 00 00 00 00 00 00   # segment id 3
""",
    "backup-read-replica-response": """
27 00 00 00               # frame length 39
02 00                     # kind: response, flags
35 00                     # opcode 53 BACKUP_READ_REPLICA
0e 00 00 00 00 00 00 00   # request id 14
00 00                     # status OK
01 00 00 00 00 00 00 00   # epoch 1
04 00 00 00               # certificate: segment length 4
0d 0c 0b 0a               # certificate: checksum 0x0a0b0c0d
01                        # flags: bit 0 closed
04 00 00 00               # data length 4
01 20 53 47               # data
""",
    "backup-get-statistics-response": """
40 00 00 00               # frame length 64
02 00                     # kind: response, flags
36 00                     # opcode 54 BACKUP_GET_STATISTICS
0f 00 00 00 00 00 00 00   # request id 15
00 00                     # status OK
01                        # durability: fsync
03 00 00 00               # replicas 3
01 00 00 00               # replicas open 1
01 00 00 00               # buffers in use 1
20 00 00 00               # buffer count 32
fd 01 00 00               # frames free 509
00 02 00 00               # frame count 512
0a 00 00 00 00 00 00 00   # disk syncs 10
28 00 00 00 00 00 00 00   # disk write jobs 40
00 00 10 00 00 00 00 00   # disk data bytes written 1048576
00                        # storage failure: absent
""",
    "recover-tablets-request": """
8c 00 00 00               # frame length 140
01 00                     # kind: request, flags
2b 00                     # opcode 43 RECOVER_TABLETS
10 00 00 00 00 00 00 00   # request id 16
05 00 00 00 00 00 00 00   # recovery master 5
02 00 00 00 00 00 00 00   # crashed master 2
01 00 00 00               # tablets: 1
01 00 00 00 00 00 00 00   #   table id 1
00 00 00 00 00 00 00 00   #   range start 0
ff ff ff ff ff ff ff 7f   #   range end 0x7fffffffffffffff
00 00 00 00 00 00 00 00   #   creation segment 0 (every segment counts)
01                        #   tier 1 flash
01 00 00 00               # backups: 1
03 00 62 3a 31            #   "b:1" (backup 0)
02 00 00 00               # segments: 2
01 00 00 00 00 00 00 00   #   segment 1
01 00 00 00               #   replicas: 1
00 00                     #     backup 0
02 00 00 00 00 00 00 00   #     epoch 2
00 00 01 00               #     length 65536
01                        #     primary
03 00 00 00 00 00 00 00   #   segment 3
01 00 00 00               #   replicas: 1
00 00                     #     backup 0
01 00 00 00 00 00 00 00   #     epoch 1
00 10 00 00               #     length 4096
00                        #     not primary
07 00 00 00 00 00 00 00   # assignment epoch 7
""",
    "renew-lease-request": """
14 00 00 00               # frame length 20
01 00                     # kind: request, flags
11 00                     # opcode 17 RENEW_LEASE
11 00 00 00 00 00 00 00   # request id 17
03 00 00 00 00 00 00 00   # server id 3
""",
    "renew-lease-response": """
12 00 00 00               # frame length 18
02 00                     # kind: response, flags
11 00                     # opcode 17 RENEW_LEASE
11 00 00 00 00 00 00 00   # request id 17
00 00                     # status OK
ee 02 00 00               # lease 750 ms
""",
    "client-lease-request": """
14 00 00 00               # frame length 20
01 00                     # kind: request, flags
18 00                     # opcode 24 CLIENT_LEASE
15 00 00 00 00 00 00 00   # request id 21
00 00 00 00 00 00 00 00   # lease 0: open a new one
""",
    "client-lease-response": """
1a 00 00 00               # frame length 26
02 00                     # kind: response, flags
18 00                     # opcode 24 CLIENT_LEASE
15 00 00 00 00 00 00 00   # request id 21
00 00                     # status OK
07 00 00 00 00 00 00 00   # lease 7
30 75 00 00               # term 30 000 ms
""",
    "check-client-leases-request": """
20 00 00 00               # frame length 32
01 00                     # kind: request, flags
19 00                     # opcode 25 CHECK_CLIENT_LEASES
16 00 00 00 00 00 00 00   # request id 22
02 00 00 00               # 2 leases
07 00 00 00 00 00 00 00   #   lease 7
09 00 00 00 00 00 00 00   #   lease 9
""",
    "check-client-leases-response": """
1a 00 00 00               # frame length 26
02 00                     # kind: response, flags
19 00                     # opcode 25 CHECK_CLIENT_LEASES
16 00 00 00 00 00 00 00   # request id 22
00 00                     # status OK
02 00 00 00               # 2 answers
a8 61 00 00               #   25 000 ms
00 00 00 00               #   expired
""",
    "hint-server-crashed-request": """
14 00 00 00               # frame length 20
01 00                     # kind: request, flags
13 00                     # opcode 19 HINT_SERVER_CRASHED
13 00 00 00 00 00 00 00   # request id 19
04 00 00 00 00 00 00 00   # server id 4
""",
    "recovery-accept-loss-request": """
14 00 00 00               # frame length 20
01 00                     # kind: request, flags
14 00                     # opcode 20 RECOVERY_ACCEPT_LOSS
14 00 00 00 00 00 00 00   # request id 20
02 00 00 00 00 00 00 00   # server id 2
""",
    "recovery-accept-loss-response": """
0e 00 00 00               # frame length 14
02 00                     # kind: response, flags
14 00                     # opcode 20 RECOVERY_ACCEPT_LOSS
14 00 00 00 00 00 00 00   # request id 20
00 00                     # status OK
""",
    "backup-fence-master-request": """
14 00 00 00               # frame length 20
01 00                     # kind: request, flags
37 00                     # opcode 55 BACKUP_FENCE_MASTER
12 00 00 00 00 00 00 00   # request id 18
02 00 00 00 00 00 00 00   # master id 2
""",
    "backup-start-partitioning-request": """
76 00 00 00               # frame length 118
01 00                     # kind: request, flags
39 00                     # opcode 57 BACKUP_START_PARTITIONING
15 00 00 00 00 00 00 00   # request id 21
02 00 00 00 00 00 00 00   # master id 2
02 00 00 00               # segments: 2
01 00 00 00 00 00 00 00   #   segment 1
03 00 00 00 00 00 00 00   #   segment 3
02 00 00 00               # partitions: 2
01 00 00 00               #   tablets: 1
01 00 00 00 00 00 00 00   #     table id 1
00 00 00 00 00 00 00 00   #     range start 0
ff ff ff ff ff ff ff 7f   #     range end 0x7fffffffffffffff
00 00 00 00 00 00 00 00   #     creation segment 0
01                        #     tier 1 flash
01 00 00 00               #   tablets: 1
01 00 00 00 00 00 00 00   #     table id 1
00 00 00 00 00 00 00 80   #     range start 0x8000000000000000
ff ff ff ff ff ff ff ff   #     range end 0xffffffffffffffff
00 00 00 00 00 00 00 00   #     creation segment 0
01                        #     tier 1 flash
""",
    "backup-start-partitioning-response": """
12 00 00 00               # frame length 18
02 00                     # kind: response, flags
39 00                     # opcode 57 BACKUP_START_PARTITIONING
15 00 00 00 00 00 00 00   # request id 21
00 00                     # status OK
01 00 00 00               # replicas to partition 1
""",
    "recover-tablets-response": """
2e 00 00 00               # frame length 46
02 00                     # kind: response, flags
2b 00                     # opcode 43 RECOVER_TABLETS
10 00 00 00 00 00 00 00   # request id 16
00 00                     # status OK
02 00 00 00 00 00 00 00   # segments replayed 2
00 00 02 00 00 00 00 00   # replica bytes read 131072
e8 03 00 00 00 00 00 00   # objects replayed 1000
07 00 00 00 00 00 00 00   # creation segment 7
""",
    "tx-prepare-request": """
b6 00 00 00               # frame length 182
01 00                     # kind: request, flags
3c 00                     # opcode 60 TX_PREPARE
17 00 00 00 00 00 00 00   # request id 23
07 00 00 00 00 00 00 00   # lease 7
0a 00 00 00 00 00 00 00   # acknowledged 10
0c 00 00 00 00 00 00 00   # transaction 12
00                        # not validate-only
02 00 00 00               # 2 ops
01 00 00 00 00 00 00 00   # op 1: table id 1
01 00 61                  #   key "a"
0c 00 00 00 00 00 00 00   #   rpc 12
02                        #   kind: write
03 00 00 00 00 00 00 00   #   version read 3
01 00 00 00 78            #   value "x"
01 00 00 00 00 00 00 00   # op 2: table id 1
01 00 62                  #   key "b"
0d 00 00 00 00 00 00 00   #   rpc 13
01                        #   kind: read
00 00 00 00 00 00 00 00   #   version read 0: absent
00 00 00 00               #   no value
03 00 00 00               # 3 participants
01 00 00 00 00 00 00 00   # participant 1: table id 1
20 a7 37 6f 99 d0 f6 d2   #   key hash of "a", 0xd2f6d0996f37a720
0c 00 00 00 00 00 00 00   #   rpc 12
01 00 00 00 00 00 00 00   # participant 2: table id 1
20 23 45 a3 38 91 00 99   #   key hash of "b", 0x99009138a3452320
0d 00 00 00 00 00 00 00   #   rpc 13
01 00 00 00 00 00 00 00   # participant 3: table id 1
2d 80 37 b5 bd 40 e6 14   #   key hash of "c", 0x14e640bdb537802d
0e 00 00 00 00 00 00 00   #   rpc 14
""",
    "tx-prepare-response": """
28 00 00 00               # frame length 40
02 00                     # kind: response, flags
3c 00                     # opcode 60 TX_PREPARE
17 00 00 00 00 00 00 00   # request id 23
00 00                     # status OK
02 00 00 00               # 2 votes
00 00                     # vote 1: status OK
01                        #   prepared
03 00 00 00 00 00 00 00   #   version 3
09 00                     # vote 2: status 9 RETRY
02                        #   (no vote)
00 00 00 00 00 00 00 00   #   version 0
""",
    "tx-decision-request": """
59 00 00 00               # frame length 89
01 00                     # kind: request, flags
3d 00                     # opcode 61 TX_DECISION
18 00 00 00 00 00 00 00   # request id 24
07 00 00 00 00 00 00 00   # lease 7
0a 00 00 00 00 00 00 00   # acknowledged 10
0c 00 00 00 00 00 00 00   # transaction 12
01                        # decision: commit
02 00 00 00               # 2 ops
01 00 00 00 00 00 00 00   # op 1: table id 1
20 a7 37 6f 99 d0 f6 d2   #   key hash of "a"
0c 00 00 00 00 00 00 00   #   rpc 12
01 00 00 00 00 00 00 00   # op 2: table id 1
20 23 45 a3 38 91 00 99   #   key hash of "b"
0d 00 00 00 00 00 00 00   #   rpc 13
""",
    "tx-decision-response": """
16 00 00 00               # frame length 22
02 00                     # kind: response, flags
3d 00                     # opcode 61 TX_DECISION
18 00 00 00 00 00 00 00   # request id 24
00 00                     # status OK
02 00 00 00               # 2 results
00 00                     #   OK
01 00                     #   UNKNOWN_TABLET
""",
    "tx-request-abort-request": """
50 00 00 00               # frame length 80
01 00                     # kind: request, flags
3e 00                     # opcode 62 TX_REQUEST_ABORT
19 00 00 00 00 00 00 00   # request id 25
07 00 00 00 00 00 00 00   # lease 7
0c 00 00 00 00 00 00 00   # transaction 12
02 00 00 00               # 2 ops
01 00 00 00 00 00 00 00   # op 1: table id 1
20 a7 37 6f 99 d0 f6 d2   #   key hash of "a"
0c 00 00 00 00 00 00 00   #   rpc 12
01 00 00 00 00 00 00 00   # op 2: table id 1
20 23 45 a3 38 91 00 99   #   key hash of "b"
0d 00 00 00 00 00 00 00   #   rpc 13
""",
    "tx-request-abort-response": """
28 00 00 00               # frame length 40
02 00                     # kind: response, flags
3e 00                     # opcode 62 TX_REQUEST_ABORT
19 00 00 00 00 00 00 00   # request id 25
00 00                     # status OK
02 00 00 00               # 2 votes
00 00                     # vote 1: status OK
01                        #   prepared
03 00 00 00 00 00 00 00   #   version 3
00 00                     # vote 2: status OK
02                        #   abort (had not voted: recorded now)
00 00 00 00 00 00 00 00   #   version 0
""",
}


def vector_bytes(name: str) -> bytes:
    """The bytes of the vector ``name``, comments and whitespace removed."""
    return hex_bytes(VECTORS[name])


def hex_bytes(text: str) -> bytes:
    """Hex digits of ``text`` as bytes, ignoring whitespace and ``#`` comments."""
    digits = "".join(line.split("#", 1)[0] for line in text.splitlines())
    return bytes.fromhex("".join(digits.split()))
