/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Test-only: the debugfs command file the test modules share. Each open file keeps the result
 * of its last command: a write (one command line, in one write) runs it, reads return the
 * result as "key=value" lines from its start. A command's handler writes into @out; its
 * negative errno fails the write, and so does a result that overflowed.
 *
 * Each module includes this once and defines its file_operations with
 * CMDFILE_FOPS(name, handler).
 */
#ifndef PEERDIRECT_TESTS_CMDFILE_H
#define PEERDIRECT_TESTS_CMDFILE_H

#include <linux/fs.h>
#include <linux/mutex.h>
#include <linux/seq_buf.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#define CMDFILE_LINE_MAX 256
#define CMDFILE_OUT_MAX 4096

struct cmdfile {
	struct mutex lock;
	loff_t read_pos;
	struct seq_buf out;
	char buf[CMDFILE_OUT_MAX];
};

/* Runs one command line (NUL-terminated, writable) and writes its result into @out. */
typedef int (*cmdfile_handler)(char *line, struct seq_buf *out);

static int cmdfile_open(struct inode *inode, struct file *file)
{
	struct cmdfile *f = kzalloc_obj(*f);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	seq_buf_init(&f->out, f->buf, sizeof(f->buf));
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int cmdfile_release(struct inode *inode, struct file *file)
{
	struct cmdfile *f = file->private_data;

	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static ssize_t cmdfile_write(struct file *file, const char __user *ubuf, size_t count,
			     cmdfile_handler handler)
{
	struct cmdfile *f = file->private_data;
	char line[CMDFILE_LINE_MAX];
	int ret;

	if (count >= sizeof(line))
		return -E2BIG;
	if (copy_from_user(line, ubuf, count))
		return -EFAULT;
	line[count] = '\0';

	mutex_lock(&f->lock);
	seq_buf_clear(&f->out);
	ret = handler(line, &f->out);
	if (seq_buf_has_overflowed(&f->out))
		ret = -EOVERFLOW;
	f->read_pos = 0;
	mutex_unlock(&f->lock);
	return ret ?: count;
}

static ssize_t cmdfile_read(struct file *file, char __user *ubuf, size_t count, loff_t *ppos)
{
	struct cmdfile *f = file->private_data;
	ssize_t ret;

	mutex_lock(&f->lock);
	ret = simple_read_from_buffer(ubuf, count, &f->read_pos, f->buf, seq_buf_used(&f->out));
	mutex_unlock(&f->lock);
	return ret;
}

/* Parses "DDDD:BB:SS.F" into @bdf[4]; -EINVAL unless it is exactly that, in range. */
static int __maybe_unused cmdfile_parse_bdf(const char *s, unsigned int *bdf)
{
	char tail;

	if (sscanf(s, "%x:%x:%x.%x%c", &bdf[0], &bdf[1], &bdf[2], &bdf[3], &tail) != 4)
		return -EINVAL;
	if (bdf[0] > 0xffff || bdf[1] > 0xff || bdf[2] > 0x1f || bdf[3] > 7)
		return -EINVAL;
	return 0;
}

/* Defines `static const struct file_operations name` whose writes run @handler. */
#define CMDFILE_FOPS(name, handler)							\
	static ssize_t name##_write(struct file *file, const char __user *ubuf,		\
				    size_t count, loff_t *ppos)				\
	{										\
		return cmdfile_write(file, ubuf, count, handler);			\
	}										\
	static const struct file_operations name = {					\
		.owner = THIS_MODULE,							\
		.open = cmdfile_open,							\
		.release = cmdfile_release,						\
		.read = cmdfile_read,							\
		.write = name##_write,							\
	}

#endif /* PEERDIRECT_TESTS_CMDFILE_H */
