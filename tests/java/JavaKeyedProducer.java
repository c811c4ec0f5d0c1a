// A Java producer with its default partitioner (as Spark's own Kafka sink uses it):
// writes each key read from stdin, one per line, to TOPIC with the key as its value.
// Run by tests with the broker's jars on the class path:
//   java -cp 'LIBS/*' JavaKeyedProducer.java BOOTSTRAP TOPIC < keys
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaKeyedProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
             BufferedReader in = new BufferedReader(
                 new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                byte[] key = line.getBytes(StandardCharsets.UTF_8);
                producer.send(new ProducerRecord<>(args[1], key, key)).get();
            }
        }
    }
}
